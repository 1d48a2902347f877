"""The pods the operator runs: kuberl's own volumes, environment and security, plus what the role adds.

Trainer pods and the initializer pod are built from the same pieces, so both run unprivileged with a
read-only root filesystem, and both see the job's engine config and cache at the same paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kuberl.engine.config import EngineConfig
from kuberl.engine.config.multi_turn import NODE_IP_ENV, TOOL_NETWORKS_ENV
from kuberl.engine.config.termination import NOT_RETRYABLE_EXIT_CODE, TRAINER_CONTAINER

from ..api import GPU_RESOURCE, MASTER_PORT, RLJob, RoleName
from ..api.pods import CACHE_DIR, CONFIG_DIR, HUB_CACHE_DIR, RESERVED_VOLUME_PREFIX
from ..validation.cluster_rules import checkpoint_mount
from .children import (
    CONFIG_FILE,
    JOBSET_RESTART_LABEL,
    LABEL_CONTROLLER,
    LABEL_JOB,
    LABEL_ROLE,
    TRAINER_UID,
    OperatorSettings,
    Owner,
    child_name,
)
from .sandbox_address import sandbox_env

SHM_VOLUME = f"{RESERVED_VOLUME_PREFIX}shm"
CONFIG_VOLUME = f"{RESERVED_VOLUME_PREFIX}config"
TMP_VOLUME = f"{RESERVED_VOLUME_PREFIX}tmp"
CHECKPOINT_VOLUME = f"{RESERVED_VOLUME_PREFIX}checkpoints"
CACHE_VOLUME = f"{RESERVED_VOLUME_PREFIX}cache"

CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    # Everything a container writes goes to /tmp, /dev/shm, the checkpoint volume, the cache (the
    # initializer) and the user's own writable mounts.
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": TRAINER_UID,
    "runAsGroup": TRAINER_UID,
    "fsGroup": TRAINER_UID,
    # A volume whose root already has the group is not walked again at every pod start: a checkpoint or
    # model cache of many files would otherwise delay each (re)start by a recursive chown.
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}


def trainer_image(job: RLJob, settings: OperatorSettings) -> str:
    """The job's image, or the operator's default (cluster_rules refuses a job that has neither)."""
    image = job.spec.image or settings.default_image
    assert image, "no trainer image: cluster_problems() refuses such a job before it is planned"
    return image


def cache_claim(job: RLJob) -> str | None:
    """The PersistentVolumeClaim of the job's cache: the user's, or the one the operator creates."""
    cache = job.spec.cache
    if cache is None:
        return None
    return cache.claim_name or child_name(job.metadata.name or "", "cache")


def config_volume(job_name: str) -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "configMap": {"name": child_name(job_name, "config")}}


def cache_volume(claim: str) -> dict[str, Any]:
    return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}


def hub_env(offline: bool) -> list[dict[str, Any]]:
    """Where huggingface_hub keeps its files: the cache volume; trainer pods never reach the hub."""
    env = [{"name": "HF_HUB_CACHE", "value": HUB_CACHE_DIR}]
    if offline:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    return env


def hub_endpoint_env(job: RLJob, settings: OperatorSettings) -> list[dict[str, Any]]:
    """HF_ENDPOINT as the job's initializer has it (the job's own initializer.env entry, else the chart's
    hubEndpoint). Trainer pods get it too: the cache keeps each endpoint's files in a folder of its own,
    and an offline pod finds its snapshot by the endpoint it came from."""
    init = job.spec.initializer
    own = [e.to_manifest() for e in (init.env if init is not None else None) or [] if e.name == "HF_ENDPOINT"]
    if own:
        return own[-1:]
    return [{"name": "HF_ENDPOINT", "value": settings.hub_endpoint}] if settings.hub_endpoint else []


def master_addr(name: str, namespace: str) -> str:
    """Rank 0's address: the actor's first pod, by the hostname JobSet gives it (<jobset>-<replicated job>-<job
    index>-<pod index>) under the job's headless Service; resolvable before the pod is Ready."""
    return f"{child_name(name, 'actor')}-0-0.{name}.{namespace}.svc"


ACTOR_PEERS = "actor-peers"
"""The replicated job of the actor's pods after its first (where it has several)."""


@dataclass(frozen=True)
class PodGroup:
    """One replicated job of the JobSet: `pods` pods of `role`, the first of them the role's pod `first`."""

    name: str
    role: RoleName
    pods: int
    first: int
    controller: bool
    """Holds the controller rank (global rank 0): the one pod that tracks and writes progress."""


def pod_groups(job: RLJob, config: EngineConfig) -> list[PodGroup]:
    """The replicated jobs of the roles with pods of their own. The actor's first pod is a replicated job
    of its own: an indexed Job's pods share one template, and only the controller's pod may hold the
    ServiceAccount token (it writes progress) and the tracking secrets."""
    groups: list[PodGroup] = []
    for role, topo in config.roles.items():
        if topo.colocated_with is not None:
            continue
        replicas = job.spec.roles.pod_template(role).replicas or 1
        if role == "actor":
            groups.append(PodGroup("actor", role, 1, 0, controller=True))
            if replicas > 1:
                groups.append(PodGroup(ACTOR_PEERS, role, replicas - 1, 1, controller=False))
        else:
            groups.append(PodGroup(role, role, replicas, 0, controller=False))
    return groups


def replicated_job(job: RLJob, group: PodGroup, config: EngineConfig, settings: OperatorSettings, owner: Owner) -> dict[str, Any]:
    """One group of a role's pods, as a replicated job of the job's JobSet: one indexed Job of its pods."""
    spec = job.spec
    name, namespace = owner.name, owner.namespace
    role = group.role
    role_spec = spec.roles.pod_template(role)  # roles.rollout: the actor's pod settings, its own replicas and GPUs
    topo = config.roles[role]
    gpus = role_spec.gpus_per_replica or 0
    replicas = group.pods
    labels = {LABEL_ROLE: role, **({LABEL_CONTROLLER: "true"} if group.controller else {})}

    resources = role_spec.resources.to_manifest() if role_spec.resources else {}
    resources = {k: dict(v) for k, v in resources.items() if v}
    if gpus:
        # Extended resources are requested through limits (requests default to them).
        resources.setdefault("limits", {})[GPU_RESOURCE] = str(gpus)

    env: list[dict[str, Any]] = [
        {"name": "KUBERL_JOB", "value": name},
        {"name": "KUBERL_ROLE", "value": role},
        # JobSet's count of gang restarts, for the logs.
        {"name": "KUBERL_ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_RESTART_LABEL}']"}}},
        {"name": "KUBERL_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_FILE}"},
        {"name": "KUBERL_PROGRESS_CONFIGMAP", "value": child_name(name, "progress")},
        # A pod's first rank: the role's offset, past the pods of the role that come before this group.
        {"name": "KUBERL_ROLE_RANK_OFFSET", "value": str(topo.rank_offset + group.first * topo.procs_per_pod)},
        {"name": "KUBERL_PROCS_PER_POD", "value": str(topo.procs_per_pod)},
        {"name": "WORLD_SIZE", "value": str(config.world_size)},
        {"name": "MASTER_ADDR", "value": master_addr(name, namespace)},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # The node's address, which HTTP tools refuse (its kubelet): engine/agents/http_network.py.
        {"name": NODE_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        # The root filesystem is read-only: caches (vLLM, torch, matplotlib, a converted GGUF) go to /tmp.
        {"name": "HOME", "value": "/tmp"},
    ]
    if settings.tool_networks:  # what the chart lets HTTP tools reach (tools.allowedNetworks)
        env.append({"name": TOOL_NETWORKS_ENV, "value": ",".join(settings.tool_networks)})
    env += sandbox_env(job, namespace)  # where tool calls run: the job's sandbox pods (sandbox_pods.py)
    claim = cache_claim(job)
    if claim is not None:
        env += hub_env(offline=True) + hub_endpoint_env(job, settings)
    if group.controller:  # the controller rank, in the actor's first pod, is the only one that tracks
        for tracker in spec.monitoring.tracking:
            if tracker.secret is not None:
                ref, variable = tracker.secret
                env.append({"name": variable, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    # The user's variables come last: they may refer to kuberl's as $(POD_NAMESPACE); the API's rules
    # keep them from setting one of kuberl's.
    env += [e.to_manifest() for e in role_spec.env or []]
    ports = [{"name": "torch", "containerPort": MASTER_PORT}]
    if spec.monitoring.enabled:
        ports.append({"name": "metrics", "containerPort": spec.monitoring.metrics_port})

    volumes, mounts = _trainer_volumes(job, role, settings)
    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": trainer_image(job, settings),
        "imagePullPolicy": spec.image_pull_policy or settings.image_pull_policy,
        "command": ["kuberl", "worker"],
        "env": env,
        "ports": ports,
        "resources": resources,
        "volumeMounts": mounts,
        # A failed rank writes why (engine/config/termination.py); one that dies before it can, its log's tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": CONTAINER_SECURITY,
    }
    if role_spec.env_from:
        container["envFrom"] = [e.to_manifest() for e in role_spec.env_from]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # SIGTERM makes the ranks stop at the next step boundary with a checkpoint (engine/runtime/stopping.py).
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
        # The pod's pause process is PID 1, not the rank: the kernel ignores a signal that PID 1 has no
        # handler for, so a SIGTERM that came while the rank was still starting Python (before its
        # handlers) would be lost, and the pod would run out its grace period. Not PID 1, the rank dies
        # of it; pause also reaps the processes a multi-GPU pod's ranks leave behind.
        "shareProcessNamespace": True,
        "subdomain": name,
        "serviceAccountName": spec.service_account_name or child_name(name, "trainer"),
        # The token is what writes the progress ConfigMap, and only the controller rank (the actor's first pod,
        # a replicated job of its own) writes it: no other pod gets one.
        "automountServiceAccountToken": group.controller,
        "securityContext": POD_SECURITY,
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
    if role_spec.runtime_class_name:
        pod_spec["runtimeClassName"] = role_spec.runtime_class_name
    scheduling = spec.run_policy.scheduling
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    # The user's labels and annotations first: kuberl's keys, which the API's rules keep out of the
    # user's, are what the operator and the schedulers select on.
    pod_annotations: dict[str, str] = dict(role_spec.annotations or {})
    pod_labels = {**(role_spec.labels or {}), LABEL_JOB: name, **labels}
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": replicas,
        "parallelism": replicas,
        # One failed pod fails its Job, and JobSet restarts every Job of the gang (jobset.py); unless the rank
        # said a restart cannot help: then the Job fails with reason PodFailurePolicy, and the JobSet with it.
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": TRAINER_CONTAINER, "operator": "In", "values": [NOT_RETRYABLE_EXIT_CODE]},
                },
            ]
        },
        "template": {
            "metadata": {"labels": pod_labels, **({"annotations": pod_annotations} if pod_annotations else {})},
            "spec": pod_spec,
        },
    }
    return {"name": group.name, "replicas": 1, "template": {"metadata": {"labels": {LABEL_JOB: name, **labels}}, "spec": job_spec}}


def _trainer_volumes(job: RLJob, role: RoleName, settings: OperatorSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """kuberl's volumes and mounts, then the job's volumes this role mounts."""
    spec = job.spec
    name = job.metadata.name or ""
    role_spec = spec.roles.pod_template(role)
    checkpoint = spec.trainer.checkpoint
    volumes: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}},
        config_volume(name),
        {"name": TMP_VOLUME, "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
    ]
    # Checkpoints go to their claim; without one, to the user's volume that holds the path; else to
    # an emptyDir (a restarted pod then starts over).
    if checkpoint.claim_name:
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": checkpoint.claim_name}})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": checkpoint.path})
    elif checkpoint_mount(spec, role) is None:
        volumes.append({"name": CHECKPOINT_VOLUME, "emptyDir": {}})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": checkpoint.path})
    claim = cache_claim(job)
    if claim is not None:
        volumes.append(cache_volume(claim))
        mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_DIR, "readOnly": True})
    used = {m.name for m in role_spec.volume_mounts or []}
    volumes += [v.to_manifest() for v in spec.volumes if v.name in used]
    mounts += [m.to_manifest() for m in role_spec.volume_mounts or []]
    return volumes, mounts
