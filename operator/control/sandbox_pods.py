"""The sandbox pods of a job whose tools run code (python, functions of a file): planned here, pure.

Tool code is written by the model, so it runs outside the trainer pods, in pods that hold nothing
worth taking: no ServiceAccount token, none of the trainer's environment, secrets or volumes (the
function's source travels with each call), no Service links, the trainer pods' restricted security
context, a read-only root with a size-limited emptyDir as scratch, and an optional RuntimeClass
(gVisor, Kata) for a kernel of their own. Each pod runs `kuberl sandbox-serve` (engine/agents/
sandbox_server.py): one call at a time, every process of a call killed and its scratch emptied after it.

For a job J in namespace N: Deployment J-sandbox (its pods carry kuberl.dev/sandbox=J and not the
job's label, so the job's Service, NetworkPolicy and status never count them), headless Service
J-sandbox (the trainers' KUBERL_SANDBOX_URL resolves to every ready pod), and NetworkPolicy
J-sandbox: ingress only from the job's trainer pods to the sandbox port, and egress only to the
networks (and the cluster DNS) that the job names in rollout.multiTurn.sandbox: none by default.

A Deployment rather than a replicated job of the JobSet: a sandbox pod that is lost (its node
drained, OOM-killed by a tool) is replaced on its own, while the trainers go on (their calls go to
the other replicas meanwhile); in the JobSet, a failed sandbox pod would fail its Job and restart
the whole gang from the last checkpoint. The cost: Kueue does not admit the sandbox pods with the
job, so their (small, CPU-only) requests are outside the queue's quota.

With rollout.multiTurn.sandbox.backend agentSandbox, the kubernetes-sigs agent-sandbox controller keeps the
pods in place of the Deployment: a SandboxTemplate J-sandbox holding exactly the same pod template, and a
SandboxWarmPool J-sandbox of `replicas` Sandboxes from it (the controller makes a pod per Sandbox, with the
template's labels and its own under agents.x-k8s.io/). The Service and NetworkPolicy are the same: the
trainers' pod backend (engine/agents/sandbox_pod.py) does not know which backend runs the pods. A cluster
without the agent-sandbox CRDs holds such a job with a MissingAPI condition (reconcile/missing_api.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from kuberl.engine.config.multi_turn import LINK_LOCAL, EgressDestinationSpec, ToolSandboxSpec

from ..api import RLJob
from .children import LABEL_MANAGED_BY, MANAGER, OperatorSettings, Owner
from .network_policy import API_VERSION as NETWORK_POLICY_API_VERSION, trainer_peer
from .pod_spec import CONTAINER_SECURITY, POD_SECURITY, trainer_image
from .sandbox_address import (
    AGENT_SANDBOX,
    AGENT_SANDBOX_EXTENSIONS_API_VERSION,
    LABEL_SANDBOX,
    SANDBOX_PORT,
    multi_turn,
    sandbox_name,
    wants_sandbox_pods,
)

SCRATCH_VOLUME = "kuberl-scratch"
SCRATCH_DIR = "/tmp"
CONTAINER = "sandbox"


def pod_labels(job_name: str) -> dict[str, str]:
    return {LABEL_SANDBOX: job_name, LABEL_MANAGED_BY: MANAGER}


def pod_template(job: RLJob, settings: OperatorSettings, owner: Owner) -> dict[str, Any]:
    """The sandbox pod, whichever backend keeps it running: labels (which the Service and NetworkPolicy
    select) and spec."""
    spec = multi_turn(job)
    assert spec is not None
    box = spec.sandbox
    resources = {"cpu": box.cpu, "memory": box.memory}
    container = {
        "name": CONTAINER,
        "image": trainer_image(job, settings),
        "imagePullPolicy": job.spec.image_pull_policy or settings.image_pull_policy,
        # PID 1 of the container: after each call every other process in it is a call's, and is killed.
        "command": ["kuberl", "sandbox-serve", "--port", str(SANDBOX_PORT), "--scratch", SCRATCH_DIR, "--wipe", "/dev/shm"],
        "env": [{"name": "HOME", "value": SCRATCH_DIR}, {"name": "TMPDIR", "value": SCRATCH_DIR}],
        "ports": [{"name": "sandbox", "containerPort": SANDBOX_PORT}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": SANDBOX_PORT}, "periodSeconds": 5, "timeoutSeconds": 5},
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [{"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}],
        "securityContext": CONTAINER_SECURITY,
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no variables naming the namespace's Services
        "securityContext": POD_SECURITY,
        "containers": [container],
        "volumes": [{"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": box.scratch_size}}],
    }
    if box.runtime_class_name:
        pod["runtimeClassName"] = box.runtime_class_name
    if job.spec.image_pull_secrets:  # read by the kubelet to pull the image; never mounted into the pod
        pod["imagePullSecrets"] = [{"name": s.name} for s in job.spec.image_pull_secrets]
    return {"metadata": {"labels": pod_labels(owner.name)}, "spec": pod}


def deployment(job: RLJob, settings: OperatorSettings, owner: Owner) -> dict[str, Any]:
    spec = multi_turn(job)
    assert spec is not None
    name = owner.name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.meta(sandbox_name(name)),
        "spec": {
            "replicas": spec.sandbox.replicas,
            "selector": {"matchLabels": {LABEL_SANDBOX: name}},
            "template": pod_template(job, settings, owner),
        },
    }


def sandbox_template(job: RLJob, settings: OperatorSettings, owner: Owner) -> dict[str, Any]:
    """backend agentSandbox: the sandbox pod as an agent-sandbox SandboxTemplate. The controller copies its
    pod template into each Sandbox and from there into the Sandbox's pod, with our labels (it adds its own,
    all under agents.x-k8s.io/). Its NetworkPolicy is Unmanaged: a Managed one (the controller's default)
    would be a second policy on the same pods, and NetworkPolicies add up, so its default egress (the
    public internet) would widen ours; the job's own NetworkPolicy J-sandbox is the only wall. No Service
    per Sandbox: the trainers reach every pod through the job's headless Service."""
    return {
        "apiVersion": AGENT_SANDBOX_EXTENSIONS_API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": owner.meta(sandbox_name(owner.name)),
        "spec": {
            "podTemplate": pod_template(job, settings, owner),
            "service": False,
            "networkPolicyManagement": "Unmanaged",
            # Only a SandboxClaim could inject variables or volumes; the operator makes no claim, and forbids both.
            "envVarsInjectionPolicy": "Disallowed",
            "volumeClaimTemplatesPolicy": "Disallowed",
        },
    }


def warm_pool(job: RLJob, owner: Owner) -> dict[str, Any]:
    """backend agentSandbox: `replicas` Sandboxes from the job's SandboxTemplate, kept running (one that is lost
    is made again). Recreate: a changed template replaces the pool's sandboxes at once, as a Deployment's
    rollout would (the default, OnReplenish, waits for each to be claimed, which no one does here)."""
    spec = multi_turn(job)
    assert spec is not None
    name = sandbox_name(owner.name)
    return {
        "apiVersion": AGENT_SANDBOX_EXTENSIONS_API_VERSION,
        "kind": "SandboxWarmPool",
        "metadata": owner.meta(name),
        "spec": {"replicas": spec.sandbox.replicas, "sandboxTemplateRef": {"name": name}, "updateStrategy": {"type": "Recreate"}},
    }


def service(owner: Owner) -> dict[str, Any]:
    """Headless: the name resolves to each ready sandbox pod, and the client spreads calls over them."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.meta(sandbox_name(owner.name)),
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_SANDBOX: owner.name},
            "ports": [{"name": "sandbox", "port": SANDBOX_PORT, "targetPort": SANDBOX_PORT}],
        },
    }


# The cluster's DNS pods, by the labels kube-dns and CoreDNS deployments carry in kube-system.
DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def ip_block(destination: EgressDestinationSpec) -> dict[str, Any]:
    """The destination's network, less the link-local ranges inside it (a 0.0.0.0/0 that a job names
    still does not reach the metadata server)."""
    network = destination.network
    excepted = [str(ll) for ll in LINK_LOCAL if ll.version == network.version and ll != network and ll.subnet_of(network)]  # type: ignore[arg-type]
    return {"cidr": str(network), **({"except": excepted} if excepted else {})}


def egress_rules(box: ToolSandboxSpec) -> list[dict[str, Any]]:
    """One rule per destination the job names, and the DNS pods when it asks for them; none by default."""
    rules: list[dict[str, Any]] = []
    for destination in box.egress:
        rule: dict[str, Any] = {"to": [{"ipBlock": ip_block(destination)}]}
        if destination.ports:
            rule["ports"] = [
                {"protocol": p.protocol, "port": p.port, **({"endPort": p.end_port} if p.end_port else {})} for p in destination.ports
            ]
        rules.append(rule)
    if box.dns:
        rules.append({"to": [DNS_PEER], "ports": DNS_PORTS})
    return rules


def network_policy(owner: Owner, trainer_roles: Sequence[str], box: ToolSandboxSpec | None = None) -> dict[str, Any]:
    """Only the job's trainer pods reach the sandbox port; the sandbox pods reach only what the job
    names in rollout.multiTurn.sandbox.egress and dns (by default Egress with no rule: not the API
    server, not DNS, not the trainers, not the internet)."""
    return {
        "apiVersion": NETWORK_POLICY_API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": owner.meta(sandbox_name(owner.name)),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_SANDBOX: owner.name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [trainer_peer(owner.name, trainer_roles)], "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]}],
            "egress": egress_rules(box) if box is not None else [],
        },
    }


def sandbox_objects(job: RLJob, settings: OperatorSettings, owner: Owner, trainer_roles: Sequence[str]) -> list[dict[str, Any]]:
    """The job's sandbox Deployment (backend agentSandbox: SandboxTemplate and SandboxWarmPool), Service and
    NetworkPolicy (none when its tools run no code).
    The NetworkPolicy is there even where the chart turns the jobs' own off: it is the sandbox's wall."""
    if not wants_sandbox_pods(job):
        return []
    spec = multi_turn(job)
    assert spec is not None
    # A suspended job holds no sandbox pod (reconcile/sandbox.py deletes the Deployment or warm pool; its resume
    # makes it again). The SandboxTemplate stays: it is only a description.
    suspended = job.spec.run_policy.suspend
    if spec.sandbox.backend == AGENT_SANDBOX:
        pods = [sandbox_template(job, settings, owner), *([] if suspended else [warm_pool(job, owner)])]
    else:
        pods = [] if suspended else [deployment(job, settings, owner)]
    return [*pods, service(owner), network_policy(owner, trainer_roles, spec.sandbox)]
