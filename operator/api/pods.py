"""What a user may add to kuberl's pods (volumes, mounts, environment, labels), and what stays kuberl's.

kuberl's pods need some paths, environment variables, volume names and labels of their own. They are
declared here, once: the planner builds the pods from these names, and the API's rules refuse a
user's mount, variable or label that would shadow one of them, in `kuberl validate` and (through
CEL) in the API server alike.
"""

from __future__ import annotations

import posixpath
from typing import Any

from pydantic import Field

from kuberl.engine.config import Rule, SpecModel
from kuberl.engine.config.tracking import SECRET_ENV

from . import kube_types
from .kube_grammar import DNSSubdomain, LabelKey, label_map

# --- what kuberl's pods own -----------------------------------------------------------------------

CONFIG_DIR = "/etc/kuberl"
"""The engine config (a ConfigMap), read-only."""
CACHE_DIR = "/var/cache/kuberl"
"""The job's cache volume: hub downloads (HF_HUB_CACHE) under hub/."""
HUB_CACHE_DIR = f"{CACHE_DIR}/hub"
# Fixed container paths kuberl mounts; the checkpoint path (trainer.checkpoint.path) is the fifth.
RESERVED_PATHS = ("/tmp", "/dev/shm", CONFIG_DIR, CACHE_DIR)

# Every variable the planner or the worker sets in a trainer or initializer container.
RESERVED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "POD_NAMESPACE",
    "HOME",
    "HF_TOKEN",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    *sorted(env for _, env in SECRET_ENV.values()),
)
RESERVED_ENV_PREFIX = "KUBERL_"

RESERVED_VOLUME_PREFIX = "kuberl-"
"""kuberl's own volumes are named kuberl-*, so a user's volume name never collides with them."""

# Label and annotation keys that kuberl, the Job controller, JobSet and the gang schedulers set or read.
RESERVED_KEY_PREFIXES = (
    "kuberl.dev/",
    "batch.kubernetes.io/",
    "jobset.sigs.k8s.io/",
    "kueue.x-k8s.io/",
    "scheduling.k8s.io/",
    "volcano.sh/",
)
RESERVED_KEYS = ("job-name", "controller-uid")


def reserved_env(name: str) -> bool:
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX)


def reserved_key(key: str) -> bool:
    return key in RESERVED_KEYS or key.startswith(RESERVED_KEY_PREFIXES)


def under(path: str, root: str) -> bool:
    """Whether `path` is `root` or inside it, compared as normalised paths: `/data/./x` and `/data//x` are
    under /data, and `/data/../proc` is not (a path that still climbs above its start is under nothing)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    if ".." in path.split("/") or ".." in root.split("/") or "\0" in path or "\0" in root:
        return False
    return path == root or path.startswith(root.rstrip("/") + "/")


def shadows_reserved_path(mount_path: str) -> str | None:
    """The reserved path that a mount at `mount_path` would cover or sit inside, if any."""
    for reserved in RESERVED_PATHS:
        if under(mount_path, reserved) or under(reserved, mount_path):
            return reserved
    return None


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


_RESERVED_PATH_CEL = " || ".join(
    f"m.mountPath == '{p}' || m.mountPath.startsWith('{p}/') || '{p}'.startsWith(m.mountPath + '/')" for p in RESERVED_PATHS
)
_RESERVED_KEY_CEL = " || ".join([f"k.startsWith('{p}')" for p in RESERVED_KEY_PREFIXES] + [f"k == '{k}'" for k in RESERVED_KEYS])


# --- the user's additions -------------------------------------------------------------------------


class Volume(kube_types.Volume):
    """A volume of the job's pods, as in a PodSpec; each role mounts the ones it needs (volumeMounts)."""

    RULES = (
        Rule(
            message=f"volume names starting with {RESERVED_VOLUME_PREFIX} are kuberl's own",
            check=lambda s: not s.name.startswith(RESERVED_VOLUME_PREFIX),
            cel=f"!self.name.startsWith('{RESERVED_VOLUME_PREFIX}')",
            field="name",
        ),
        Rule(
            message="give exactly one volume source (persistentVolumeClaim, configMap, secret, emptyDir, nfs, csi, ...)",
            check=lambda s: sum(getattr(s, f) is not None for f in type(s).model_fields if f != "name") == 1,
            cel=" + ".join(f"(has(self.{info.alias}) ? 1 : 0)" for f, info in kube_types.Volume.model_fields.items() if f != "name")
            + " == 1",
        ),
    )


def _reserved_mounts(s: "PodTemplate") -> list[str]:
    return [f"{m.mount_path} ({reserved})" for m in s.volume_mounts or [] if (reserved := shadows_reserved_path(m.mount_path))]


def _reserved_env(s: Any) -> list[str]:
    """`s`: a PodTemplate or an InitializerSpec (whatever has env)."""
    return [e.name for e in s.env or [] if reserved_env(e.name)]


RESERVED_ENV_RULE = Rule(
    message=f"env must not set a variable kuberl sets ({', '.join(RESERVED_ENV)} or {RESERVED_ENV_PREFIX}*); "
    "a hub token goes in model.tokenSecretRef",
    check=lambda s: not _reserved_env(s),
    cel=f"!has(self.env) || self.env.all(e, !(e.name in {_cel_list(RESERVED_ENV)}) && !e.name.startsWith('{RESERVED_ENV_PREFIX}'))",
    field="env",
    detail=lambda s: ", ".join(_reserved_env(s)),
)
"""Shared by every container spec that takes `env`: a role's pods and the initializer."""


def _reserved_keys(s: "PodTemplate") -> list[str]:
    return [k for k in [*(s.labels or {}), *(s.annotations or {})] if reserved_key(k)]


class PodTemplate(SpecModel):
    """What a role adds to its pods: mounts of the job's volumes, environment, metadata, runtime class."""

    volume_mounts: list[kube_types.VolumeMount] | None = Field(
        default=None, max_length=32, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["mountPath"]}
    )
    """Mounts of spec.volumes in the trainer container; each mountPath at most once."""
    env: list[kube_types.EnvVar] | None = Field(
        default=None, max_length=64, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )
    """Environment variables of the trainer container (value, or valueFrom a Secret or ConfigMap key)."""
    env_from: list[kube_types.EnvFromSource] | None = Field(default=None, max_length=16)
    """Every key of a Secret or ConfigMap as a variable; kuberl's own variables take precedence."""
    labels: label_map(64) | None = None  # type: ignore[valid-type]
    """Labels of the role's pods."""
    annotations: dict[LabelKey, str] | None = Field(default=None, max_length=64)
    """Annotations of the role's pods; one that sets an AppArmor or seccomp profile to unconfined is refused on a cluster."""
    runtime_class_name: DNSSubdomain | None = None
    """The RuntimeClass of the role's pods (for example a sandboxed runtime, or one with NVIDIA's hooks): one the chart
    allows (admission.allowedRuntimeClasses; none by default)."""

    RULES = (
        Rule(
            message=f"a volumeMount must not be at, inside or above a path kuberl mounts ({', '.join(RESERVED_PATHS)}): mount elsewhere, e.g. /data",
            check=lambda s: not _reserved_mounts(s),
            cel=f"!has(self.volumeMounts) || self.volumeMounts.all(m, !({_RESERVED_PATH_CEL}))",
            field="volumeMounts",
            detail=lambda s: ", ".join(_reserved_mounts(s)),
        ),
        RESERVED_ENV_RULE,
        Rule(
            message=f"labels and annotations must not use keys kuberl or the schedulers set ({', '.join(RESERVED_KEY_PREFIXES)}, "
            f"{', '.join(RESERVED_KEYS)}); the queue and priority go in runPolicy.scheduling",
            check=lambda s: not _reserved_keys(s),
            cel=f"(!has(self.labels) || self.labels.all(k, !({_RESERVED_KEY_CEL})))"
            f" && (!has(self.annotations) || self.annotations.all(k, !({_RESERVED_KEY_CEL})))",
            field="labels",
            detail=lambda s: ", ".join(_reserved_keys(s)),
        ),
    )


# --- rules over the whole spec: mounts against the job's volumes and its checkpoint path ------------

_ROLE_NAMES = ("actor", "critic", "ref", "reward")


def _mounts(spec) -> list[tuple[str, kube_types.VolumeMount]]:
    return [(name, m) for name, role in spec.roles.present().items() for m in getattr(role, "volume_mounts", None) or []]


def _undeclared(spec) -> list[str]:
    declared = {v.name for v in spec.volumes}
    return [f"roles.{role}: {m.name}" for role, m in _mounts(spec) if m.name not in declared]


def _over_checkpoints(spec) -> list[str]:
    path = spec.trainer.checkpoint.path
    return [f"roles.{role}: {m.mount_path}" for role, m in _mounts(spec) if under(m.mount_path, path)]


def _duplicate_volumes(spec) -> list[str]:
    names = [v.name for v in spec.volumes]
    return sorted({n for n in names if names.count(n) > 1})


def _each_role_cel(condition: str) -> str:
    """CEL: `condition` (over a mount `m`) holds for every volumeMount of every role."""
    return " && ".join(
        f"(!has(self.roles.{r}) || !has(self.roles.{r}.volumeMounts) || self.roles.{r}.volumeMounts.all(m, {condition}))"
        for r in _ROLE_NAMES
    )


SPEC_VOLUME_RULES = (
    Rule(
        message="volume names must be unique",
        check=lambda s: not _duplicate_volumes(s),
        # The CRD's list type (a map keyed by name) refuses duplicates by itself.
        field="volumes",
        detail=lambda s: ", ".join(_duplicate_volumes(s)),
    ),
    Rule(
        message="a volumeMount names a volume that spec.volumes does not declare: add it to spec.volumes",
        check=lambda s: not _undeclared(s),
        cel=_each_role_cel("has(self.volumes) && self.volumes.exists(v, v.name == m.name)"),
        field="volumes",
        detail=lambda s: ", ".join(_undeclared(s)),
    ),
    Rule(
        message="a volumeMount must not be at or inside trainer.checkpoint.path (kuberl mounts the checkpoint volume there); "
        "mount above it to keep checkpoints on your volume, or elsewhere",
        check=lambda s: not _over_checkpoints(s),
        cel=_each_role_cel("m.mountPath != self.trainer.checkpoint.path && !m.mountPath.startsWith(self.trainer.checkpoint.path + '/')"),
        field="roles",
        detail=lambda s: ", ".join(_over_checkpoints(s)),
    ),
)
