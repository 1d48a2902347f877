"""Hub downloads on a cluster: the cache volume they go to, and the initializer pod that fetches them.

Before any trainer pod of a job starts, one initializer pod downloads every hub repository the job
names (model.hubId, tokenizer.hubId, reward.model.hubId) into the cache volume; the trainer pods mount
it read-only and never reach the hub. A gang restart, and a later job sharing the claim, find the
files there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kuberl.engine.config import Rule, SpecModel

from . import kube_types
from .kube_grammar import DNSSubdomain, Quantity
from .pods import RESERVED_ENV_RULE
from .roles import ResourceRequirements


class CacheSpec(SpecModel):
    """The volume that hub downloads go to: fetched once by the initializer, read by every pod."""

    claim_name: DNSSubdomain | None = None
    """An existing PersistentVolumeClaim. Share one between jobs: a later job that asks for a repository and
    revision already in it downloads nothing. Trainer pods on several nodes need ReadWriteMany or ReadOnlyMany."""
    size: Quantity | None = None
    """Or: a PersistentVolumeClaim of this size that the operator creates for the job (deleted with it)."""
    storage_class_name: DNSSubdomain | None = None
    """size only: its StorageClass (default: the cluster's default class)."""
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = "ReadWriteMany"
    """size only: ReadWriteMany (pods on several nodes), ReadWriteOnce (one node) or ReadWriteOncePod."""

    RULES = (
        Rule(
            message="set exactly one of claimName (an existing claim) and size (a claim the operator creates)",
            check=lambda s: (s.claim_name is None) != (s.size is None),
            cel="has(self.claimName) != has(self.size)",
        ),
        Rule(
            message="storageClassName applies only to size",
            check=lambda s: s.storage_class_name is None or s.size is not None,
            cel="!has(self.storageClassName) || has(self.size)",
            field="storageClassName",
        ),
    )


class InitializerSpec(SpecModel):
    """The pod that downloads the job's hub repositories into the cache before the trainers start."""

    env: list[kube_types.EnvVar] | None = Field(
        default=None, max_length=32, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )
    """Its environment: HF_ENDPOINT for a mirror or an in-cluster proxy, HTTPS_PROXY, ..."""
    resources: ResourceRequirements | None = None
    active_deadline_seconds: int = Field(default=7200, ge=60, le=7 * 86400)
    """Fail the job if the downloads take longer than this (at least a minute, at most a week)."""

    RULES = (RESERVED_ENV_RULE,)
