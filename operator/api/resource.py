"""The RLJob resource: its API identity, metadata rules, spec and status."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kuberl.engine.config import Rule, SpecModel

from .spec import RLJobSpec
from .status import RLJobStatus

GROUP = "kuberl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ["rlj"]
CATEGORIES = ["kuberl"]

# Children are named <job>-<role>[-<index>]; Kubernetes caps names that become labels and
# hostnames at 63 characters, so the job's own name must leave room for "-critic-" and an index.
MAX_NAME_LENGTH = 42
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(SpecModel):
    """The part of metav1.ObjectMeta that kuberl reads; server-set fields pass through."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL)
    """A DNS-1035 label of at most 42 characters: it prefixes every child object's name."""
    generate_name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH - 5)
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}

    RULES = (
        Rule(
            message="set name or generateName",
            check=lambda s: s.name is not None or s.generate_name is not None,
        ),
    )


class RLJob(SpecModel):
    api_version: Literal["kuberl.dev/v1alpha1"]
    kind: Literal["RLJob"]
    metadata: ObjectMeta
    spec: RLJobSpec
    status: RLJobStatus | None = None


def metadata_schema() -> dict:
    """What a CRD may say about metadata: restrictions on name and generateName, nothing else."""
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": MAX_NAME_LENGTH, "pattern": DNS_LABEL},
            "generateName": {"type": "string", "maxLength": MAX_NAME_LENGTH - 5},
        },
    }
