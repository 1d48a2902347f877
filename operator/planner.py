"""The planner: an RLJob in, the Kubernetes objects it should have out. Pure: no API calls.

For a job named J in namespace N the operator keeps:
- Service J: headless, selects every pod of the job, so rank 0 is reachable as J-actor-0.J.N.svc
  (MASTER_ADDR) before it is Ready.
- ConfigMap J-config: engine-config.json, the EngineConfig every rank reads.
- ConfigMap J-progress, ServiceAccount J-trainer, Role and RoleBinding J-trainer: the trainer may
  get, update and patch that one ConfigMap and nothing else; its controller rank writes its
  progress there and the operator copies it into the RLJob's status. No pod can touch the RLJob.
- one indexed Job J-ROLE per role with pods of its own (parallelism = completions = replicas,
  backoffLimit 0: the operator restarts the whole gang, never Kubernetes a single pod).
Every object carries the labels kuberl.dev/job and (for workloads) kuberl.dev/role and
kuberl.dev/attempt, and an owner reference to the RLJob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kuberl.engine.config import EngineConfig, ParallelLayout, RoleTopology

from .api import API_VERSION, GPU_RESOURCE, KIND, MASTER_PORT, RLJob

LABEL_JOB = "kuberl.dev/job"
LABEL_ROLE = "kuberl.dev/role"
LABEL_ATTEMPT = "kuberl.dev/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "kuberl-operator"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
CONFIG_FILE = "engine-config.json"
CONFIG_DIR = "/etc/kuberl"
TRAINER_UID = 10001


@dataclass(frozen=True)
class OperatorSettings:
    """Defaults the operator was installed with (Helm values)."""

    default_image: str = "ghcr.io/kuberl/trainer:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    shm_size: str = "16Gi"
    """Size limit of each pod's /dev/shm (NCCL and dataloaders use it)."""


@dataclass(frozen=True)
class Plan:
    """The desired children of one RLJob."""

    support: list[dict[str, Any]]
    """Service, ConfigMaps, ServiceAccount, Role, RoleBinding, and a Volcano PodGroup if asked for."""
    jobs: dict[str, dict[str, Any]]
    """The indexed Job of each role that has pods of its own, by role name."""


def child_name(job_name: str, suffix: str) -> str:
    return f"{job_name}-{suffix}"


def topology(job: RLJob) -> dict[str, RoleTopology]:
    """Each role's ranks in the global world: roles with pods of their own, actor first, side by side."""
    roles = job.spec.roles
    out: dict[str, RoleTopology] = {}
    offset = 0
    for name, role in roles.present().items():
        colocated = getattr(role, "colocate_with", None)
        layout = roles.layout(name)
        out[name] = RoleTopology(
            ranks=roles.ranks(name),
            rank_offset=0 if colocated else offset,
            procs_per_pod=max(1, roles.actor.gpus_per_replica or 0) if colocated else max(1, role.gpus_per_replica or 0),
            layout=ParallelLayout(tp=layout.tp, pp=layout.pp, dp=layout.dp),
            rollout_tp=(getattr(layout, "rollout_tp", None) or 1) if name == "actor" else 1,
            colocated_with=colocated,
        )
        if not colocated:
            offset += role.own_ranks
    return out


def engine_config(job: RLJob) -> EngineConfig:
    spec = job.spec
    roles = topology(job)
    return EngineConfig(
        job=job.metadata.name or "",
        world_size=sum(r.ranks for r in roles.values() if r.colocated_with is None),
        master_port=MASTER_PORT,
        metrics_port=spec.monitoring.metrics_port if spec.monitoring.enabled else None,
        model=spec.model,
        tokenizer=spec.tokenizer,
        data=spec.data,
        algorithm=spec.algorithm,
        rollout=spec.rollout,
        reward=spec.reward,
        trainer=spec.trainer,
        roles=roles,
        tracking=spec.monitoring.tracking,
    )


def plan(job: RLJob, uid: str, attempt: int, settings: OperatorSettings = OperatorSettings()) -> Plan:
    """The children of `job` (whose API object has `uid`) for restart attempt `attempt`."""
    name = job.metadata.name
    namespace = job.metadata.namespace
    assert name and namespace, "plan() needs the stored object's name and namespace"
    owner = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "controller": True, "blockOwnerDeletion": True}

    def meta(obj_name: str, **labels: str) -> dict[str, Any]:
        return {
            "name": obj_name,
            "namespace": namespace,
            "labels": {LABEL_JOB: name, LABEL_MANAGED_BY: MANAGER, **labels},
            "ownerReferences": [owner],
        }

    config = engine_config(job)
    trainer = child_name(name, "trainer")
    progress = child_name(name, "progress")
    ports = [{"name": "torch", "port": MASTER_PORT, "targetPort": MASTER_PORT}]
    if job.spec.monitoring.enabled:
        port = job.spec.monitoring.metrics_port
        ports.append({"name": "metrics", "port": port, "targetPort": port})
    support: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(name),
            "spec": {
                "clusterIP": "None",
                "selector": {LABEL_JOB: name},
                "publishNotReadyAddresses": True,
                "ports": ports,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(child_name(name, "config")),
            "data": {CONFIG_FILE: json.dumps(config.to_manifest(), indent=2, sort_keys=True)},
        },
        # Written by the controller rank; the operator creates it so the trainer never needs `create`.
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(progress)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(trainer)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(trainer),
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [progress], "verbs": ["get", "update", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(trainer),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": trainer},
            "subjects": [{"kind": "ServiceAccount", "name": trainer, "namespace": namespace}],
        },
    ]
    scheduling = job.spec.run_policy.scheduling
    total_pods = sum(job.spec.roles.pods().values())
    if scheduling.gang_scheduler == "volcano":
        group: dict[str, Any] = {"minMember": total_pods}
        if scheduling.queue_name:
            group["queue"] = scheduling.queue_name
        if scheduling.priority_class_name:
            group["priorityClassName"] = scheduling.priority_class_name
        support.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": meta(name), "spec": group})

    jobs = {
        role: _role_job(job, role, config, attempt, settings, meta)
        for role, topo in config.roles.items()
        if topo.colocated_with is None
    }
    return Plan(support=support, jobs=jobs)


def _role_job(job: RLJob, role: str, config: EngineConfig, attempt: int, settings: OperatorSettings, meta) -> dict[str, Any]:
    spec = job.spec
    name = job.metadata.name
    namespace = job.metadata.namespace
    role_spec = getattr(spec.roles, role)
    topo = config.roles[role]
    gpus = role_spec.gpus_per_replica or 0
    replicas = role_spec.replicas or 1
    labels = {LABEL_ROLE: role, LABEL_ATTEMPT: str(attempt)}

    resources = role_spec.resources.to_manifest() if role_spec.resources else {}
    resources = {k: dict(v) for k, v in resources.items() if v}
    if gpus:
        # Extended resources are requested through limits (requests default to them).
        resources.setdefault("limits", {})[GPU_RESOURCE] = str(gpus)

    env = [
        {"name": "KUBERL_JOB", "value": name},
        {"name": "KUBERL_ROLE", "value": role},
        {"name": "KUBERL_ATTEMPT", "value": str(attempt)},
        {"name": "KUBERL_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_FILE}"},
        {"name": "KUBERL_PROGRESS_CONFIGMAP", "value": child_name(name, "progress")},
        {"name": "KUBERL_ROLE_RANK_OFFSET", "value": str(topo.rank_offset)},
        {"name": "KUBERL_PROCS_PER_POD", "value": str(topo.procs_per_pod)},
        {"name": "WORLD_SIZE", "value": str(config.world_size)},
        # Rank 0 is the actor's pod 0: its stable name through the headless Service.
        {"name": "MASTER_ADDR", "value": f"{child_name(name, 'actor')}-0.{name}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # The root filesystem is read-only: caches (Hugging Face, vLLM, torch, matplotlib) go to /tmp.
        {"name": "HOME", "value": "/tmp"},
    ]
    token = spec.model.token_secret_ref
    if token is not None:
        # By reference: the token's value never appears in the Job, the ConfigMap or the status.
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
    if role == "actor":  # the controller rank, in the actor's first pod, is the only one that tracks
        for tracker in spec.monitoring.tracking:
            if tracker.secret is not None:
                ref, variable = tracker.secret
                env.append({"name": variable, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    ports = [{"name": "torch", "containerPort": MASTER_PORT}]
    if spec.monitoring.enabled:
        ports.append({"name": "metrics", "containerPort": spec.monitoring.metrics_port})

    checkpoint = spec.trainer.checkpoint
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}},
        {"name": "config", "configMap": {"name": child_name(name, "config")}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "checkpoints", **({"persistentVolumeClaim": {"claimName": checkpoint.claim_name}} if checkpoint.claim_name else {"emptyDir": {}})},
    ]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "checkpoints", "mountPath": checkpoint.path},
    ]
    container = {
        "name": "trainer",
        "image": spec.image or settings.default_image,
        "imagePullPolicy": spec.image_pull_policy or settings.image_pull_policy,
        "command": ["kuberl", "worker"],
        "env": env,
        "ports": ports,
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            # Everything a rank writes goes to /tmp, /dev/shm and the checkpoint volume.
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # SIGTERM makes the ranks stop at the next step boundary with a checkpoint (engine/runtime/stopping.py).
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
        "subdomain": name,
        "serviceAccountName": spec.service_account_name or child_name(name, "trainer"),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": TRAINER_UID,
            "runAsGroup": TRAINER_UID,
            "fsGroup": TRAINER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    if role_spec.node_selector:
        pod_spec["nodeSelector"] = dict(role_spec.node_selector)
    if role_spec.tolerations:
        pod_spec["tolerations"] = [t.to_manifest() for t in role_spec.tolerations]
    if role_spec.affinity:
        pod_spec["affinity"] = role_spec.affinity.to_manifest()
    scheduling = spec.run_policy.scheduling
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    pod_annotations: dict[str, str] = {}
    if scheduling.gang_scheduler == "volcano":
        pod_spec["schedulerName"] = "volcano"
        pod_annotations[VOLCANO_GROUP_ANNOTATION] = name

    job_meta = meta(child_name(name, role), **labels)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": replicas,
        "parallelism": replicas,
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {LABEL_JOB: name, **labels}, **({"annotations": pod_annotations} if pod_annotations else {})},
            "spec": pod_spec,
        },
    }
    if scheduling.gang_scheduler == "kueue":
        # Kueue admits a Job by unsuspending it once its quota is free.
        job_meta["labels"][KUEUE_QUEUE_LABEL] = scheduling.queue_name
        job_spec["suspend"] = True
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": job_spec}
