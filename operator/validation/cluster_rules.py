"""Rules that hold only when a job runs on a cluster: every file the engine opens must be in the pod.

`kuberl run` reads paths on the machine it runs on, so a manifest for it may name ./data or ~/models.
In a pod the engine sees only the image, kuberl's own mounts and the role's volumeMounts; a path
anywhere else is not there (or is the image's), and the job would fail after its pods start. These
rules find that before any pod exists: in `kuberl validate` (a cluster is its default target) and in
the operator, which refuses such a job with an InvalidSpec condition. The API server cannot check
them: comparing every path with every mount of every role costs more than its CEL budget allows.
The chart's allow-lists (volume sources, RuntimeClasses, unconfined profiles, control-plane tolerations:
admission.py) are checked here too, and by the chart's admission policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from .admission import AdmissionPolicy, admission_problems
from ..api import RLJob, RLJobSpec
from ..api.pods import under
from .problems import Problem

ACTOR_ONLY = ("actor",)


@dataclass(frozen=True)
class EnginePath:
    """A path from the spec that the engine opens in a pod, and which roles' pods open it."""

    field: str
    """Where it is in the manifest, e.g. spec.data.train.path."""
    path: str
    roles: tuple[str, ...]
    """Roles whose pods open it (a colocated role's reads happen in the actor's pods)."""
    writes: bool = False


def _own_pods(spec: RLJobSpec, role: str) -> str:
    """The role whose pods' mounts a role's reads see: itself, or the actor when colocated, or for roles.rollout,
    whose pods take the actor's volumeMounts (Roles.pod_template)."""
    return "actor" if role == "rollout" or getattr(getattr(spec.roles, role), "colocate_with", None) else role


def engine_paths(spec: RLJobSpec) -> list[EnginePath]:
    """Every local path of the spec, with the roles that open it (engine/runtime: rl.py, role_worker.py, checks.py)."""
    present = list(spec.roles.present())
    model_roles = tuple(dict.fromkeys(_own_pods(spec, r) for r in present if r != "reward"))
    every_pod = tuple(dict.fromkeys(_own_pods(spec, r) for r in present))
    found: list[EnginePath] = []

    def add(field: str, path: str | None, roles: tuple[str, ...], writes: bool = False) -> None:
        if path is not None:
            found.append(EnginePath(f"spec.{field}", path, roles, writes))

    for kind in ("path", "gguf"):
        add(f"model.{kind}", getattr(spec.model, kind), model_roles)  # the policy, reference and critic load it
        if spec.tokenizer is not None:
            add(f"tokenizer.{kind}", getattr(spec.tokenizer, kind), ACTOR_ONLY)
        if spec.reward is not None and spec.reward.model is not None and spec.roles.reward is not None:
            add(f"reward.model.{kind}", getattr(spec.reward.model, kind), (_own_pods(spec, "reward"),))
        elif spec.reward is not None and spec.reward.model is not None:
            add(f"reward.model.{kind}", getattr(spec.reward.model, kind), ACTOR_ONLY)
    add("data.train.path", spec.data.train.path, ACTOR_ONLY)
    if spec.data.validation is not None:
        add("data.validation.path", spec.data.validation.path, ACTOR_ONLY)
    if spec.reward is not None and spec.reward.python is not None:
        add("reward.python.path", spec.reward.python.path, ACTOR_ONLY)  # scored on the controller rank
    for i, plugin in enumerate(spec.algorithm.plugins):
        add(f"algorithm.plugins[{i}].path", plugin.path, every_pod)  # every rank loads the plug-ins
    multi_turn = spec.rollout.multi_turn if spec.rollout is not None else None
    for i, tool in enumerate(multi_turn.tools if multi_turn is not None else []):
        add(f"rollout.multiTurn.tools[{i}].path", tool.path, ACTOR_ONLY)  # every actor rank runs its replica's tool calls
    add("trainer.exportPath", spec.trainer.export_path, ACTOR_ONLY, writes=True)
    for i, tracker in enumerate(spec.monitoring.tracking):
        add(f"monitoring.tracking[{i}].path", tracker.path, ACTOR_ONLY, writes=True)
    return found


def _mount_of(spec: RLJobSpec, role: str, path: str, writes: bool) -> bool:
    """Whether `path` lies under a mount of the role's pods that serves it (writable, if it is written)."""
    if under(path, spec.trainer.checkpoint.path):
        return True  # kuberl's checkpoint volume: a claim, or an emptyDir, always writable
    role_spec = getattr(spec.roles, _own_pods(spec, role))
    return any(under(path, m.mount_path) and not (writes and m.read_only) for m in getattr(role_spec, "volume_mounts", None) or [])


def _fix(spec: RLJobSpec, role: str, path: str) -> str:
    example = "/data" if not path.startswith("/") else "/" + path.strip("/").split("/")[0]
    return (
        f"mount the volume that holds it: add it to spec.volumes (e.g. a persistentVolumeClaim) and to "
        f"spec.roles.{role}.volumeMounts (e.g. mountPath: {example})"
    )


def cluster_problems(
    job: RLJob, source: str, default_image: str | None = "", policy: AdmissionPolicy | None = AdmissionPolicy()
) -> list[Problem]:
    """What keeps `job` from running on a cluster although its manifest is valid. `default_image`: the
    operator's trainer image ("" when unknown, as in `kuberl validate`; None: the operator has none);
    `policy`: what the chart allows beyond the admission defaults (None: leave the allow-lists to the
    cluster, whose admission policy and operator know its chart's values, as `kuberl submit` does)."""
    spec = job.spec
    problems: list[Problem] = admission_problems(job, source, policy) if policy is not None else []
    if spec.image is None and default_image is None:
        problems.append(
            Problem(
                source,
                "spec.image",
                "no trainer image: set spec.image, or install the operator with "
                "the chart's trainerImage (where you pushed the image `make images` builds)",
            )
        )
    for p in engine_paths(spec):
        if not p.path.startswith("/"):
            problems.append(
                Problem(
                    source,
                    p.field,
                    f"{p.path!r} is not an absolute path: in a pod the engine opens paths inside "
                    "the container; mount a volume and give the path in it, e.g. /data/... "
                    "(a manifest for `kuberl run` on one machine: kuberl validate --local)",
                )
            )
            continue
        for role in p.roles:
            if not _mount_of(spec, role, p.path, p.writes):
                what = "write" if p.writes else "read"
                where = (
                    "writable volumeMount of roles.{role}, nor under trainer.checkpoint.path" if p.writes else "volumeMount of roles.{role}"
                )
                problems.append(
                    Problem(
                        source,
                        p.field,
                        f"{p.path} is under no {where.format(role=role)}, and those pods {what} it: " + _fix(spec, role, p.path),
                    )
                )
                break
    fields = spec.hub_fields()
    if fields and spec.cache is None:
        problems.append(
            Problem(
                source,
                "spec.cache",
                f"{', '.join(fields)} names a hub repository: on a cluster it is downloaded "
                "once, by an initializer, into a cache volume that every pod reads; set spec.cache "
                "(claimName: an existing PersistentVolumeClaim, or size: one the operator creates)",
            )
        )
    checkpoint = spec.trainer.checkpoint
    if checkpoint.claim_name is None:
        for role in dict.fromkeys(_own_pods(spec, r) for r in spec.roles.pods()):  # the rollout pods' are the actor's
            mount = checkpoint_mount(spec, role)
            if mount is not None and mount.read_only:
                problems.append(
                    Problem(
                        source,
                        "spec.trainer.checkpoint.path",
                        f"{checkpoint.path} lies under the read-only "
                        f"volumeMount {mount.mount_path} of roles.{role}: checkpoints are written there; "
                        "make the mount writable or set trainer.checkpoint.claimName",
                    )
                )
    return problems


def checkpoint_mount(spec: RLJobSpec, role: str):
    """The user's volumeMount of `role` that holds trainer.checkpoint.path, if any (the deepest)."""
    path = spec.trainer.checkpoint.path
    mounts = [m for m in getattr(getattr(spec.roles, _own_pods(spec, role)), "volume_mounts", None) or [] if under(path, m.mount_path)]
    return max(mounts, key=lambda m: len(m.mount_path), default=None)
