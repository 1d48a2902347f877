"""The planner: an RLJob in, the Kubernetes objects it should have out. Pure: no API calls.

For a job named J in namespace N the operator keeps:
- Service J: headless, selects every pod of the job, so rank 0 is reachable as J-actor-0.J.N.svc
  (MASTER_ADDR) before it is Ready.
- ConfigMap J-config: engine-config.json, the EngineConfig every rank reads.
- ConfigMap J-progress, ServiceAccount J-trainer, Role and RoleBinding J-trainer: the trainer may
  get, update and patch that one ConfigMap and nothing else; its controller rank writes its
  progress there and the operator copies it into the RLJob's status. No pod can touch the RLJob.
- PersistentVolumeClaim J-cache when spec.cache asks for a size, and Job J-initializer when the job
  names a hub repository: it fills the cache once, before the first trainer pod (initializer_job.py).
- NetworkPolicy J (unless the chart turns it off): only the job's own trainer pods reach its pods, and
  the chart's Prometheus its metrics port (network_policy.py).
- Deployment, Service and NetworkPolicy J-sandbox when the job's tools run code (python, functions
  of a file): the pods those calls run in, outside the trainers (sandbox_pods.py).
- JobSet J: one replicated job per role with pods of its own, each an indexed Job (jobset.py,
  pod_spec.py); Kueue admits it whole when the job names a LocalQueue.
Every object carries the label kuberl.dev/job (pods also kuberl.dev/role) and an owner reference to
the RLJob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from kuberl.engine.config import EngineConfig, ParallelLayout, RoleTopology

from ..api import MASTER_PORT, InitializationStatus, RLJob, RoleName
from .children import CONFIG_FILE, LABEL_JOB, OperatorSettings, Owner, child_name
from .initializer_job import initializer_job, needs_initializer
from .jobset import jobset
from .network_policy import network_policy
from .sandbox_pods import sandbox_objects


@dataclass(frozen=True)
class Plan:
    """The desired children of one RLJob."""

    support: list[dict[str, Any]]
    """Service, ConfigMaps, ServiceAccount, Role, RoleBinding, the cache's claim if the job asks for one, and
    the NetworkPolicy unless the operator was installed without."""
    jobset: dict[str, Any]
    """Every pod of every role: one replicated job per role with pods of its own."""
    initializer: dict[str, Any] | None = None
    """The Job that fills the cache, for a job that names a hub repository."""


def topology(job: RLJob) -> dict[RoleName, RoleTopology]:
    """Each role's ranks in the global world: roles with pods of their own, actor first, side by side."""
    roles = job.spec.roles
    out: dict[RoleName, RoleTopology] = {}
    offset = 0
    for key, role in roles.present().items():
        name = cast(RoleName, key)  # present() is keyed by ROLE_NAMES; its annotation says str
        colocated = getattr(role, "colocate_with", None)
        layout = roles.layout(name)
        out[name] = RoleTopology(
            ranks=roles.ranks(name),
            rank_offset=0 if colocated else offset,
            procs_per_pod=max(1, roles.actor.gpus_per_replica or 0) if colocated else max(1, role.gpus_per_replica or 0),
            layout=ParallelLayout(tp=layout.tp, pp=layout.pp, dp=layout.dp, ep=layout.ep),
            rollout_tp=(getattr(layout, "rollout_tp", None) or 1) if name == "actor" else 1,
            colocated_with=colocated,
        )
        if not colocated:
            offset += role.own_ranks
    return out


def engine_config(job: RLJob, initialized: InitializationStatus | None = None) -> EngineConfig:
    """What every rank reads. Once the initializer has run, each hub repository's revision is the commit it
    fetched: every pod, in every attempt, loads the same weights even if the branch moves on."""
    spec = job.spec
    roles = topology(job)
    model, tokenizer, reward = spec.model, spec.tokenizer, spec.reward
    if initialized is not None:

        def pinned(source, field):
            commit = initialized.commit_of(field)
            return source.model_copy(update={"revision": commit}) if source is not None and commit else source

        model, tokenizer = pinned(model, "model"), pinned(tokenizer, "tokenizer")
        if reward is not None and reward.model is not None:
            reward = reward.model_copy(update={"model": pinned(reward.model, "reward.model")})
    return EngineConfig(
        job=job.metadata.name or "",
        world_size=sum(r.ranks for r in roles.values() if r.colocated_with is None),
        master_port=MASTER_PORT,
        metrics_port=spec.monitoring.metrics_port if spec.monitoring.enabled else None,
        model=model,
        tokenizer=tokenizer,
        data=spec.data,
        algorithm=spec.algorithm,
        rollout=spec.rollout,
        reward=reward,
        trainer=spec.trainer,
        roles=roles,
        tracking=spec.monitoring.tracking,
    )


def plan(
    job: RLJob,
    uid: str,
    settings: OperatorSettings = OperatorSettings(),
    initialized: InitializationStatus | None = None,
    restarts_before: int = 0,
    preemptions_before: int = 0,
) -> Plan:
    """The children of `job` (whose API object has `uid`); `initialized` is what the initializer reported, once
    it has; the two counts are the RLJob's when its JobSet is made (see jobset.jobset)."""
    name = job.metadata.name
    namespace = job.metadata.namespace
    assert name and namespace, "plan() needs the stored object's name and namespace"
    owner = Owner(name=name, namespace=namespace, uid=uid)
    meta = owner.meta

    config = engine_config(job, initialized)
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
    cache = job.spec.cache
    if cache is not None and cache.size is not None:
        claim_spec: dict[str, Any] = {"accessModes": [cache.access_mode], "resources": {"requests": {"storage": str(cache.size)}}}
        if cache.storage_class_name:
            claim_spec["storageClassName"] = cache.storage_class_name
        support.append(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(child_name(name, "cache")), "spec": claim_spec}
        )

    own_pods = [role for role, topo in config.roles.items() if topo.colocated_with is None]
    if settings.network_policy:
        support.append(network_policy(owner, own_pods, config.metrics_port, settings.metrics_peers))
    support += sandbox_objects(job, settings, owner, own_pods)  # tool code's pods (sandbox_pods.py)

    initializer = initializer_job(job, settings, owner) if needs_initializer(job) else None
    children = jobset(job, config, settings, owner, restarts_before=restarts_before, preemptions_before=preemptions_before)
    return Plan(support=support, jobset=children, initializer=initializer)
