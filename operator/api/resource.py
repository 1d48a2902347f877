"""The RLJob resource: its API identity, metadata rules, spec and status."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kuberl.engine.config import Rule, SpecModel
from kuberl.engine.config.base import pattern

from . import kube_types
from .kube_grammar import ANNOTATIONS_MAX_BYTES, DNSLabel, LabelKey, _checked, generate_name_errors, label_map
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
DNS_LABEL = pattern(
    r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
    "a DNS-1035 label: lower-case letters, digits and '-', starting with a letter and ending with a letter or digit (it names the job's pods and Service)",
)


class ObjectMeta(kube_types.ObjectMeta):
    """metav1.ObjectMeta, validated as the API server does (server-set fields are read, not set)."""

    name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL)
    """A DNS-1035 label of at most 42 characters: it prefixes every child object's name."""
    generate_name: Annotated[str, _checked(generate_name_errors)] | None = Field(
        default=None, alias="generateName", min_length=1, max_length=MAX_NAME_LENGTH - 5
    )
    """A prefix to which the API server appends 5 characters; the result must be a valid name."""
    namespace: DNSLabel | None = None
    labels: label_map(1024) | None = None  # type: ignore[valid-type]
    annotations: dict[LabelKey, str] | None = None
    """Keys are label keys; keys and values together at most 256 KiB, as the API server allows."""

    RULES = (
        Rule(
            message="set name or generateName",
            check=lambda s: s.name is not None or s.generate_name is not None,
        ),
        Rule(
            message=f"annotations may hold at most {ANNOTATIONS_MAX_BYTES // 1024} KiB of keys and values",
            check=lambda s: sum(len(k.encode()) + len(v.encode()) for k, v in (s.annotations or {}).items()) <= ANNOTATIONS_MAX_BYTES,
            field="annotations",
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
