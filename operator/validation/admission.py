"""What an RLJob may ask of its pods beyond what its creator could ask of a pod: the allow-lists.

An RLJob's creator is trusted exactly as much as a pod creator in its namespace, but the operator makes
the pods with its own rights. So an RLJob must not reach the node (hostPath, gitRepo and the other
volume sources that mount what the node or a remote server holds), run under a RuntimeClass the admin did
not choose, unconfine its AppArmor or seccomp profile, or land on the control plane, unless the chart
allows it. Those rules are defined here, once: `admission_problems` is the Python check (`kuberl validate`
and the operator, which refuses such a job with an InvalidSpec condition) and admission_policy.py renders the same
rules as the CEL of the chart's ValidatingAdmissionPolicy.

What only the API server can know (whether the request's user may get each Secret the job names, and
create pods when it names a ServiceAccount) is the policy's alone: `cluster_checks` says what it will ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import BaseModel

from kuberl.engine.config import SecretKeyRef
from kuberl.engine.config.multi_turn import ToolSandboxSpec

from ..api import PodGroupSpec, RLJob, RLJobSpec, kube_types
from .problems import Problem

# --- the contract: defaults, and the chart values that widen them ------------------------------------

DEFAULT_VOLUME_SOURCES = (
    "persistentVolumeClaim",
    "configMap",
    "secret",
    "emptyDir",
    "ephemeral",
    "projected",
    "csi",
    "image",
    "downwardAPI",
)
"""Volume sources whose data comes from the namespace's own objects, the pod itself or the cluster's storage
drivers, never from the node's filesystem or a server the pod's creator names (hostPath, gitRepo, nfs, iscsi,
...): the sources Pod Security's `restricted` profile allows."""
VOLUME_SOURCES = tuple(info.alias for name, info in kube_types.Volume.model_fields.items() if name != "name")
"""Every volume source of a PodSpec, as the API spells it (what the chart value may name)."""

CONTROL_PLANE_TAINTS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")

# Annotations that select a pod's or container's AppArmor or seccomp profile; "unconfined" switches it off.
PROFILE_ANNOTATION_PREFIXES = ("container.apparmor.security.beta.kubernetes.io/", "container.seccomp.security.alpha.kubernetes.io/")
PROFILE_ANNOTATION_KEYS = ("seccomp.security.alpha.kubernetes.io/pod",)
UNCONFINED = "unconfined"

VALUE_VOLUME_SOURCES = "admission.allowedVolumeSources"
VALUE_RUNTIME_CLASSES = "admission.allowedRuntimeClasses"
VALUE_CONTROL_PLANE = "admission.allowControlPlaneTolerations"
VALUE_SANDBOX_EGRESS = "admission.allowedSandboxEgress"
VALUE_SANDBOX_DNS = "admission.allowSandboxDNS"

MAX_CHECKED_SECRET_REFERENCES = 24
"""Secret references (counting repeats) the policy checks one by one for a user who may get only some of the
namespace's Secrets: each check costs 350000 of the API server's CEL budget of 10^7 per request. A user who
may get every Secret of the namespace is checked once, whatever the count."""

# The spec fields through which a job names a Secret, a ServiceAccount or a privileged setting. All are
# immutable once the job exists (spec.IMMUTABLE_FIELDS), so the policy judges a CREATE, and an UPDATE only
# if one of them changes: the operator's and `kuberl suspend`'s updates are not asked for rights they never use.
GRANTING_FIELDS = ("model", "tokenizer", "reward", "roles", "monitoring", "serviceAccountName", "volumes", "initializer")


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the chart allows beyond the defaults (its `admission` values; the operator's --allow-* flags)."""

    allowed_volume_sources: tuple[str, ...] = ()
    """Added to DEFAULT_VOLUME_SOURCES."""
    allowed_runtime_classes: tuple[str, ...] = ()
    """The RuntimeClasses a role may name; empty: none. A RuntimeClass picks the container runtime and may add
    tolerations and a node selector of its own (its scheduling section), so which ones a tenant may use is the
    admin's call: typically a gVisor or Kata class, or the NVIDIA runtime's."""
    allow_control_plane_tolerations: bool = False
    allowed_sandbox_egress: tuple[str, ...] = ()
    """The networks (CIDRs, written as a job must write them) that a job's tool sandbox pods may be let out
    to (rollout.multiTurn.sandbox.egress); empty: none. The sandbox NetworkPolicy selects pods by a label
    that any pod creator of the namespace can set, so the networks a job may open are the ones the admin
    would open to every such pod."""
    allow_sandbox_dns: bool = False
    """Whether a job may let its sandbox pods ask the cluster's DNS (rollout.multiTurn.sandbox.dns)."""

    @property
    def volume_sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(DEFAULT_VOLUME_SOURCES + self.allowed_volume_sources))


# --- the Python check ------------------------------------------------------------------------------


def _source_of(volume: kube_types.Volume) -> str:
    return next(
        info.alias or name for name, info in type(volume).model_fields.items() if name != "name" and getattr(volume, name) is not None
    )


def _tolerates_control_plane(t: Any) -> bool:
    # An empty key with operator Exists tolerates every taint, the control plane's included.
    return not t.key or t.key in CONTROL_PLANE_TAINTS


def unconfining(key: str, value: str) -> bool:
    """Whether a pod annotation switches its AppArmor or seccomp profile off."""
    return value == UNCONFINED and (key in PROFILE_ANNOTATION_KEYS or key.startswith(PROFILE_ANNOTATION_PREFIXES))


def admission_problems(job: RLJob, source: str, policy: AdmissionPolicy = AdmissionPolicy()) -> list[Problem]:
    """What the chart's allow-lists refuse in `job` (the checks that need no cluster)."""
    spec = job.spec
    problems: list[Problem] = []
    sources = policy.volume_sources
    for i, volume in enumerate(spec.volumes):
        kind = _source_of(volume)
        if kind not in sources:
            problems.append(
                Problem(
                    source,
                    f"spec.volumes[{i}].{kind}",
                    f"volume {volume.name}: {kind} is not an allowed volume source "
                    f"(allowed: {', '.join(sources)}): it would give the pods what a pod's creator may not reach "
                    f"through the job; use a persistentVolumeClaim, or ask the cluster admin to add {kind} to the "
                    f"chart value {VALUE_VOLUME_SOURCES}",
                )
            )
    for role, pods in spec.roles.present().items():
        where = f"spec.roles.{role}"
        if isinstance(pods, PodGroupSpec):  # roles.rollout (RolloutRoleSpec) has the actor's runtime class and metadata
            if pods.runtime_class_name is not None and pods.runtime_class_name not in policy.allowed_runtime_classes:
                allowed = ", ".join(policy.allowed_runtime_classes) or "none"
                problems.append(
                    Problem(
                        source,
                        f"{where}.runtimeClassName",
                        f"RuntimeClass {pods.runtime_class_name} is not allowed "
                        f"(allowed: {allowed}): leave it out, or ask the cluster admin to add it to the chart value "
                        f"{VALUE_RUNTIME_CLASSES}",
                    )
                )
            for key, value in (pods.annotations or {}).items():
                if unconfining(key, value):
                    problems.append(
                        Problem(
                            source,
                            f"{where}.annotations[{key}]",
                            "an unconfined AppArmor or seccomp profile is refused: "
                            "kuberl's pods always run under the runtime's default profiles; remove the annotation",
                        )
                    )
        for i, toleration in enumerate(pods.tolerations or []):  # roles.rollout's own placement too
            if not policy.allow_control_plane_tolerations and _tolerates_control_plane(toleration):
                what = f"the control-plane taint {toleration.key}" if toleration.key else "every taint (an empty key with operator Exists)"
                problems.append(
                    Problem(
                        source,
                        f"{where}.tolerations[{i}]",
                        f"tolerates {what}, which puts the job's pods on the "
                        f"control plane's nodes: tolerate your GPU pool's own taints, or ask the cluster admin "
                        f"to set the chart value {VALUE_CONTROL_PLANE}",
                    )
                )
    multi_turn = spec.rollout.multi_turn if spec.rollout is not None else None
    sandbox_class = multi_turn.sandbox.runtime_class_name if multi_turn is not None else None
    if sandbox_class is not None and sandbox_class not in policy.allowed_runtime_classes:  # the tool sandbox pods'
        allowed = ", ".join(policy.allowed_runtime_classes) or "none"
        problems.append(
            Problem(
                source,
                "spec.rollout.multiTurn.sandbox.runtimeClassName",
                f"RuntimeClass {sandbox_class} is "
                f"not allowed (allowed: {allowed}): leave it out, or ask the cluster admin to add it to the "
                f"chart value {VALUE_RUNTIME_CLASSES}",
            )
        )
    problems += _sandbox_egress_problems(multi_turn.sandbox if multi_turn is not None else None, source, policy)
    return problems


def _sandbox_egress_problems(sandbox: ToolSandboxSpec | None, source: str, policy: AdmissionPolicy) -> list[Problem]:
    """The tool sandbox pods' egress and DNS, each under its chart value. The networks are compared as written
    (the admission policy's CEL compares strings), so a job names them exactly as the chart lists them."""
    if sandbox is None:
        return []
    problems = []
    allowed = ", ".join(policy.allowed_sandbox_egress) or "none"
    for i, destination in enumerate(sandbox.egress):
        if destination.cidr not in policy.allowed_sandbox_egress:
            problems.append(
                Problem(
                    source,
                    f"spec.rollout.multiTurn.sandbox.egress[{i}].cidr",
                    f"{destination.cidr} is not a network "
                    f"the sandbox pods may reach (allowed: {allowed}): name one of those as written, leave "
                    f"egress out, or ask the cluster admin to add it to the chart value {VALUE_SANDBOX_EGRESS}",
                )
            )
    if sandbox.dns and not policy.allow_sandbox_dns:
        problems.append(
            Problem(
                source,
                "spec.rollout.multiTurn.sandbox.dns",
                "the sandbox pods may not ask the cluster's DNS here: "
                f"set dns: false, or ask the cluster admin to set the chart value {VALUE_SANDBOX_DNS}",
            )
        )
    return problems


# --- what only the cluster can check ---------------------------------------------------------------


@dataclass(frozen=True)
class SecretReference:
    field: str
    """Where the job names it, e.g. spec.roles.actor.env[0].valueFrom.secretKeyRef."""
    name: str


def _alias(model: BaseModel, name: str) -> str:
    return type(model).model_fields[name].alias or name


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any, str]]:
    """(path, model, attribute) for every field of every model under `value`."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            child = getattr(value, name)
            yield path, value, name
            yield from _walk(child, f"{path}.{_alias(value, name)}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}[{key}]")


# The types and fields that name a Secret of the namespace; what the pods (or the kubelet for them) then read.
_SECRET_NAME_FIELDS: dict[type, str] = {
    SecretKeyRef: "name",  # model/tokenizer/reward.model tokenSecretRef, tracking credentials
    kube_types.SecretKeySelector: "name",  # env valueFrom.secretKeyRef
    kube_types.SecretEnvSource: "name",  # envFrom secretRef
    kube_types.SecretProjection: "name",  # projected volume sources
    kube_types.SecretVolumeSource: "secret_name",
    kube_types.AzureFileVolumeSource: "secret_name",
}
# Volume sources' references to the Secret their driver reads (csi's node-publish secret, cephfs, rbd, ...).
_SECRET_REF_ATTRIBUTES = ("secret_ref", "node_publish_secret_ref")


def secret_references(spec: RLJobSpec) -> list[SecretReference]:
    """Every Secret of its namespace that the job's pods read (imagePullSecrets aside: the kubelet uses those
    to pull, and a pod's creator needs no right on them either)."""
    found: list[SecretReference] = []
    for path, model, attr in _walk(spec, "spec"):
        value = getattr(model, attr)
        if _SECRET_NAME_FIELDS.get(type(model)) == attr and value:
            found.append(SecretReference(path, value))
        elif attr in _SECRET_REF_ATTRIBUTES and isinstance(value, kube_types.LocalObjectReference) and value.name:
            found.append(SecretReference(f"{path}.{_alias(model, attr)}", value.name))
    return found


def cluster_checks(spec: RLJobSpec) -> list[str]:
    """What the chart's admission policy will also ask the API server about this job (nothing offline can)."""
    checks = []
    if spec.service_account_name is not None:
        checks.append(
            f"that you may create pods in the namespace (spec.serviceAccountName: {spec.service_account_name} runs the "
            "pods with that ServiceAccount's rights)"
        )
    names = sorted({r.name for r in secret_references(spec)})
    if names:
        checks.append(f"that you may get Secret {', '.join(names)} (the pods read {'it' if len(names) == 1 else 'them'})")
    return checks
