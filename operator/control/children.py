"""Names, labels and settings shared by everything the operator creates for an RLJob."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..validation.admission import AdmissionPolicy
from ..api import API_VERSION, KIND

LABEL_JOB = "kuberl.dev/job"
LABEL_ROLE = "kuberl.dev/role"
LABEL_CONTROLLER = "kuberl.dev/controller"
"""On the one pod that holds the controller rank (global rank 0): the pod that serves metrics and writes progress."""
LABEL_COMPONENT = "kuberl.dev/component"
"""On the initializer's Job and pod ("initializer"), which belong to no role and no attempt."""
INITIALIZER = "initializer"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "kuberl-operator"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOBSET_RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
"""JobSet's label on each Job and pod: the gang restart it belongs to (0 before any)."""
RESTARTS_BEFORE = "kuberl.dev/restarts-before"
PREEMPTIONS_BEFORE = "kuberl.dev/preemptions-before"
"""Annotations of a JobSet: the RLJob's restarts and preemptions before it was made (a suspended job's is
deleted and made again on resume), so that its status counts from there."""
CONFIG_FILE = "engine-config.json"
TRAINER_UID = 10001


@dataclass(frozen=True)
class OperatorSettings:
    """Defaults the operator was installed with (Helm values)."""

    default_image: str | None = None
    """The trainer image of RLJobs that name none (the chart's trainerImage); None: such a job is refused."""
    image_pull_policy: str = "IfNotPresent"
    shm_size: str = "16Gi"
    """Size limit of each pod's /dev/shm (NCCL and dataloaders use it)."""
    hub_endpoint: str | None = None
    """HF_ENDPOINT of every initializer (a hub mirror or an in-cluster proxy), unless the job's
    spec.initializer.env sets its own; None: huggingface_hub's default, the public hub."""
    admission: AdmissionPolicy = AdmissionPolicy()
    """What the chart allows an RLJob beyond the admission defaults (its `admission` values)."""
    network_policy: bool = True
    """Give every job a NetworkPolicy (network_policy.py): only its own trainer pods reach its pods."""
    metrics_peers: tuple[dict[str, Any], ...] = ()
    """NetworkPolicy peers (namespaceSelector and/or podSelector) that may reach a job's metrics port: the
    chart's Prometheus. Empty: no one from outside the job."""
    tool_networks: tuple[str, ...] = ()
    """CIDRs that HTTP tools may reach although they are loopback, link-local, the node or the API server (the
    chart's tools.allowedNetworks); passed to the trainer pods."""


def child_name(job_name: str, suffix: str) -> str:
    return f"{job_name}-{suffix}"


@dataclass(frozen=True)
class Owner:
    """The RLJob every child belongs to: names, namespace, and the owner reference they carry."""

    name: str
    namespace: str
    uid: str

    def meta(self, obj_name: str, **labels: str) -> dict[str, Any]:
        reference = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        return {
            "name": obj_name,
            "namespace": self.namespace,
            "labels": {LABEL_JOB: self.name, LABEL_MANAGED_BY: MANAGER, **labels},
            "ownerReferences": [reference],
        }
