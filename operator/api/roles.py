"""The pods of each role: how many, what they request, where they run, and their parallel layout."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kuberl.engine.config import ActorLayout, ParallelLayout, Rule, SpecModel

from .kube_grammar import LabelKey, LabelValue, Quantity, label_keys_cel, label_map, parse_quantity
from .kube_types import Affinity
from .pods import PodTemplate

GPU_RESOURCE = "nvidia.com/gpu"
RoleName = Literal["actor", "critic", "ref", "reward", "rollout"]
ROLE_NAMES: tuple[RoleName, ...] = ("actor", "critic", "ref", "reward", "rollout")


def _over_limit(s: "ResourceRequirements") -> list[str]:
    return [name for name, request in s.requests.items() if name in s.limits and parse_quantity(request) > parse_quantity(s.limits[name])]


class ResourceRequirements(SpecModel):
    """CPU, memory and other requests and limits of each pod (GPUs come from gpusPerReplica)."""

    requests: dict[LabelKey, Quantity] = Field(default={}, max_length=16)
    """Resource name (cpu, memory, ephemeral-storage, example.com/foo) to a non-negative quantity."""
    limits: dict[LabelKey, Quantity] = Field(default={}, max_length=16)
    """At least the request of the same resource."""

    RULES = (
        Rule(
            # Python checks the keys by their type (LabelKey); this is the CRD's half.
            message="resource names must be qualified names such as cpu, memory or example.com/foo",
            check=lambda s: True,
            cel=f"{label_keys_cel('self.requests')} && {label_keys_cel('self.limits')}",
        ),
        Rule(
            message="a request must not exceed the limit of the same resource",
            check=lambda s: not _over_limit(s),
            # No CEL: comparing quantities costs more than the API server's CEL budget allows over
            # four roles (measured); the API server refuses such a pod when the operator creates it.
            field="requests",
            detail=lambda s: ", ".join(f"{n}: {s.requests[n]} > {s.limits[n]}" for n in _over_limit(s)),
        ),
        Rule(
            message=f"do not request {GPU_RESOURCE} here: set the role's gpusPerReplica",
            check=lambda s: GPU_RESOURCE not in s.requests and GPU_RESOURCE not in s.limits,
            cel=f"!('{GPU_RESOURCE}' in self.requests) && !('{GPU_RESOURCE}' in self.limits)",
        ),
    )


class Toleration(SpecModel):
    """A toleration of a node taint, as in a PodSpec."""

    key: LabelKey | None = None
    """The taint's key, a label key; empty (with operator Exists) matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Equal: the taint's key and value match; Exists: the key matches, whatever the value."""
    value: LabelValue | None = None
    """Equal: the taint's value, a label value."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect to tolerate; empty tolerates every effect."""
    toleration_seconds: int | None = None
    """NoExecute only: how long the pod stays bound after the taint appears."""

    RULES = (
        Rule(
            message="operator Exists takes no value",
            check=lambda s: s.operator != "Exists" or s.value is None,
            cel="self.operator != 'Exists' || !has(self.value)",
            field="value",
        ),
        Rule(
            message="an empty key needs operator Exists",
            check=lambda s: s.key is not None or s.operator == "Exists",
            cel="has(self.key) || self.operator == 'Exists'",
            field="key",
        ),
        Rule(
            message="tolerationSeconds applies only to effect NoExecute",
            check=lambda s: s.toleration_seconds is None or s.effect == "NoExecute",
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            field="tolerationSeconds",
        ),
    )


# CEL for "this role's own ranks", with the defaults of unset fields spelt out.
_OWN_RANKS_CEL = (
    "(has(self.replicas) ? self.replicas : 1) * ((has(self.gpusPerReplica) && self.gpusPerReplica > 0) ? self.gpusPerReplica : 1)"
)
_LAYOUT_SIZE_CEL = "self.layout.tp * self.layout.pp * self.layout.dp"
_PLACEMENT_FIELDS = {
    "replicas": "replicas",
    "gpus_per_replica": "gpusPerReplica",
    "resources": "resources",
    "node_selector": "nodeSelector",
    "tolerations": "tolerations",
    "affinity": "affinity",
    **{name: info.alias for name, info in PodTemplate.model_fields.items()},
}


class PodPlacement(SpecModel):
    """Which nodes a role's pods run on and what each requests."""

    resources: ResourceRequirements | None = None
    node_selector: label_map(64) | None = None  # type: ignore[valid-type]
    """Labels of the node pool this role's pods must land on."""
    tolerations: list[Toleration] | None = Field(default=None, max_length=64)
    """Taints of the node pool that this role's pods tolerate; the control plane's (node-role.kubernetes.io/control-plane,
    /master, or every taint with an empty key) only where the chart allows it (admission.allowControlPlaneTolerations)."""


PLACEMENT_FIELDS = tuple(PodPlacement.model_fields)
"""The fields of PodPlacement: what roles.rollout may set for its own pods, the rest being the actor's."""


class PodGroupSpec(PodTemplate, PodPlacement):
    """Where and on what a role's own pods run, and what they add to kuberl's pod."""

    replicas: int | None = Field(default=None, ge=1, le=4096)
    """Pods of this role (default 1)."""
    gpus_per_replica: int | None = Field(default=None, ge=0, le=16)
    """GPUs per pod (default 0: CPU). A pod runs one rank per GPU, or one rank without GPUs."""
    affinity: Affinity | None = None
    """A Kubernetes Affinity, as in a PodSpec (node affinity, pod affinity and anti-affinity)."""

    @property
    def own_ranks(self) -> int:
        """Ranks of the role's own pods."""
        return (self.replicas or 1) * max(1, self.gpus_per_replica or 0)


def _layout_matches_ranks(guard_cel: str, skip: "Any") -> Rule:
    return Rule(
        message="layout tp*pp*dp must equal the role's ranks, replicas * max(1, gpusPerReplica)",
        check=lambda s: skip(s) or s.layout is None or s.layout.world_size == s.own_ranks,
        cel=f"{guard_cel}!has(self.layout) || {_LAYOUT_SIZE_CEL} == {_OWN_RANKS_CEL}",
        field="layout",
        detail=lambda s: f"tp*pp*dp = {s.layout.world_size if s.layout else 1}, ranks = {s.own_ranks}",
    )


class ActorSpec(PodGroupSpec):
    """The actor's pods: it trains with Megatron and generates with vLLM on the same ranks."""

    layout: ActorLayout | None = None
    """Training layout and rollout tensor parallelism; tp*pp*dp must equal the actor's ranks (default: all data-parallel)."""

    RULES = (*PodTemplate.RULES, _layout_matches_ranks("", lambda s: False))


class RoleSpec(PodGroupSpec):
    """A critic, reference or reward role: pods of its own, or the actor's ranks with colocateWith."""

    layout: ParallelLayout | None = None
    """Training layout; tp*pp*dp must equal the role's ranks (default: all ranks data-parallel)."""
    colocate_with: Literal["actor"] | None = None
    """Run on the actor's ranks (time-shared with it) instead of pods of its own."""

    RULES = (
        *PodTemplate.RULES,
        Rule(
            message="a colocated role runs on the actor's pods: remove its " + ", ".join(_PLACEMENT_FIELDS.values()),
            check=lambda s: s.colocate_with is None or all(getattr(s, f) is None for f in _PLACEMENT_FIELDS),
            cel="!has(self.colocateWith) || (" + " && ".join(f"!has(self.{f})" for f in _PLACEMENT_FIELDS.values()) + ")",
            field="colocateWith",
        ),
        _layout_matches_ranks("has(self.colocateWith) || ", lambda s: s.colocate_with is not None),
    )


class RolloutRoleSpec(PodPlacement):
    """The generation fleet of rollout.placement: separate: ranks of their own, each a vLLM engine. Its pods
    are the actor's (volumes, environment, metadata, runtime class, affinity), placed and sized by its own
    resources, nodeSelector and tolerations where it sets them (e.g. a node pool of inference GPUs)."""

    replicas: int | None = Field(default=None, ge=1, le=4096)
    """Pods of this role (default 1)."""
    gpus_per_replica: int | None = Field(default=None, ge=0, le=16)
    """GPUs per pod (default 0: CPU). A pod runs one rank per GPU, or one rank without GPUs."""
    layout: ParallelLayout | None = None
    """dp: the vLLM engines, one per rank (tp*pp*dp must equal the role's ranks; tp and pp 1 for now)."""

    RULES = (
        _layout_matches_ranks("", lambda s: False),
        Rule(
            message="tensor- or pipeline-parallel rollout engines are not supported yet with separate placement: "
            "set layout tp: 1, pp: 1 (one vLLM engine per rank)",
            check=lambda s: s.layout is None or (s.layout.tp, s.layout.pp) == (1, 1),
            cel="!has(self.layout) || (self.layout.tp == 1 && self.layout.pp == 1)",
            field="layout",
        ),
    )

    @property
    def own_ranks(self) -> int:
        return (self.replicas or 1) * max(1, self.gpus_per_replica or 0)


class Roles(SpecModel):
    """The job's roles. The actor is always there; the others as the algorithm needs them."""

    actor: ActorSpec
    """The policy: trains with Megatron and generates with vLLM."""
    critic: RoleSpec | None = None
    """ppo: the value model."""
    ref: RoleSpec | None = None
    """The reference policy, for a KL term (algorithm.klCoef > 0) and for dpo."""
    reward: RoleSpec | None = None
    """A reward model (reward.model)."""
    rollout: RolloutRoleSpec | None = None
    """The generation fleet of rollout.placement: separate. Its pods are the actor's (volumes, environment,
    metadata, affinity) with their own replicas and gpusPerReplica, and their own resources, nodeSelector and
    tolerations where set (else the actor's)."""

    RULES = (
        *(
            Rule(
                message="a colocated role's layout must cover the actor's ranks: tp*pp*dp = the actor's ranks",
                check=lambda s, r=role: (
                    getattr(s, r) is None
                    or getattr(s, r).colocate_with is None
                    or getattr(s, r).layout is None
                    or getattr(s, r).layout.world_size == s.actor.own_ranks
                ),
                cel=(
                    f"!has(self.{role}) || !has(self.{role}.colocateWith) || !has(self.{role}.layout)"
                    f" || self.{role}.layout.tp * self.{role}.layout.pp * self.{role}.layout.dp"
                    f" == {_OWN_RANKS_CEL.replace('self.', 'self.actor.')}"
                ),
                field=f"{role}.layout",
                detail=lambda s, r=role: f"tp*pp*dp = {getattr(s, r).layout.world_size}, actor ranks = {s.actor.own_ranks}",
            )
            for role in ("critic", "ref", "reward")
        ),
    )

    def present(self) -> dict[str, PodGroupSpec | RolloutRoleSpec]:
        """The roles that are set, by name, actor first."""
        return {name: role for name in ROLE_NAMES if (role := getattr(self, name)) is not None}

    def pods(self) -> dict[str, int]:
        """Pods of each role that has pods of its own (colocated roles have none), actor first."""
        return {name: role.replicas or 1 for name, role in self.present().items() if not getattr(role, "colocate_with", None)}

    def pod_template(self, name: RoleName) -> PodGroupSpec:
        """What a role's own pods are made from: its spec; for roles.rollout, the actor's pod settings with the
        rollout role's replicas and gpusPerReplica, and each placement field it sets (the actor's where it does not)."""
        role = getattr(self, name)
        if isinstance(role, RolloutRoleSpec):
            own = {f: getattr(role, f) for f in PLACEMENT_FIELDS if getattr(role, f) is not None}
            return self.actor.model_copy(
                update={"replicas": role.replicas, "gpus_per_replica": role.gpus_per_replica, "layout": None, **own}
            )
        return role

    def ranks(self, name: RoleName) -> int:
        """The ranks a role computes on: its own, or the actor's when colocated."""
        role = getattr(self, name)
        return self.actor.own_ranks if getattr(role, "colocate_with", None) else role.own_ranks

    def layout(self, name: RoleName) -> ParallelLayout:
        """A role's training layout, all data-parallel when left out."""
        role = getattr(self, name)
        return role.layout or ParallelLayout(dp=self.ranks(name))
