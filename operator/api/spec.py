"""RLJobSpec: the whole job, and the rules that tie its sections together."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kuberl.engine.config import (
    AlgorithmSpec,
    DataSpec,
    ModelSpec,
    RewardSpec,
    RolloutSpec,
    Rule,
    SpecModel,
    TokenizerSpec,
    TrainerSpec,
)
from kuberl.engine.config.algorithm_catalog import ADVANTAGES, PRESETS
from kuberl.engine.config.algorithm_rules import (
    CRITIC_ESTIMATORS,
    CRITIC_PRESETS,
    PAIR_PRESETS,
    REFERENCE_PRESETS,
    cel_in,
    group_baseline_cel,
    group_option_cel,
    needs_critic_cel,
    pairs_cel,
    words,
)
from kuberl.engine.config.options import option_manifest_name

from .initializer import CacheSpec, InitializerSpec
from .kube_grammar import DNSSubdomain, ImageReference
from .pods import SPEC_VOLUME_RULES, Volume
from .roles import Roles
from .run_policy import MonitoringSpec, RunPolicy

# torch.distributed's rendezvous port on rank 0; the metrics port must not take it.
MASTER_PORT = 29500


class LocalObjectReference(SpecModel):
    name: str = Field(min_length=1, max_length=253)
    """The object's name, in the RLJob's namespace."""


# What a running job cannot change: its pods, engine config and checkpoints depend on them.
# runPolicy (suspend, backoffLimit, deadlines) stays mutable.
IMMUTABLE_FIELDS = (
    "model",
    "tokenizer",
    "data",
    "algorithm",
    "rollout",
    "reward",
    "roles",
    "trainer",
    "monitoring",
    "image",
    "imagePullPolicy",
    "imagePullSecrets",
    "serviceAccountName",
    "volumes",
    "cache",
    "initializer",
)


def _immutable(field: str) -> dict[str, str]:
    return {
        "rule": f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        "message": f"{field} cannot change once the RLJob exists (only runPolicy can): create a new RLJob",
        "fieldPath": f".{field}",
    }


def _sequences_per_step(s: "RLJobSpec") -> int:
    samples = 1 if s.algorithm.pairs else s.rollout_or_default().samples_per_prompt
    return s.trainer.prompts_per_step * samples


def _mini_batch(s: "RLJobSpec") -> int:
    return s.trainer.mini_batch_size or _sequences_per_step(s)


# CEL spellings of the two helpers above (defaults written out: the API server has applied the
# CRD's defaults before it evaluates a rule, but rollout itself may be absent).
_SAMPLES_CEL = f"({pairs_cel('self.algorithm')} || !has(self.rollout) ? 1 : self.rollout.samplesPerPrompt)"
_PAIRS, _REFERENCE = words(PAIR_PRESETS), words(REFERENCE_PRESETS)
_GROUP_OPTIONS = words(
    f"{name}'s {option_manifest_name(k)}: {str(v).lower()}" for name, e in ADVANTAGES.items() for k, v in e.group_options.items()
)
_SEQUENCES_CEL = f"self.trainer.promptsPerStep * {_SAMPLES_CEL}"
_MINI_CEL = f"(has(self.trainer.miniBatchSize) ? self.trainer.miniBatchSize : {_SEQUENCES_CEL})"


_SEPARATE_CEL = "(has(self.rollout) && has(self.rollout.placement) && self.rollout.placement == 'separate')"
_SEPARATE_STEPS = ("on_policy",)
_NOT_SEPARATE_PRESETS = tuple(sorted(n for n, p in PRESETS.items() if not p.pairs and p.step not in _SEPARATE_STEPS))
_GREEDY_ESTIMATORS = tuple(sorted(n for n, e in ADVANTAGES.items() if e.needs_greedy))


def _separate(s: "RLJobSpec") -> bool:
    return s.rollout is not None and s.rollout.placement == "separate"


def _separate_algorithm_ok(s: "RLJobSpec") -> bool:
    a = s.algorithm
    return (
        a.name not in _NOT_SEPARATE_PRESETS
        and (a.step is None or a.step.name in _SEPARATE_STEPS)
        and (a.advantage is None or a.advantage.name not in _GREEDY_ESTIMATORS)
    )


_SEPARATE_ALGORITHM_CEL = (
    f"!({cel_in('self.algorithm.name', _NOT_SEPARATE_PRESETS)})"
    f" && (!has(self.algorithm.step) || {cel_in('self.algorithm.step.name', _SEPARATE_STEPS)})"
    f" && (!has(self.algorithm.advantage) || !({cel_in('self.algorithm.advantage.name', _GREEDY_ESTIMATORS)}))"
)

SEPARATE_RULES = (
    Rule(
        message="rollout.placement: separate needs roles.rollout, the ranks that generate (e.g. roles.rollout: {replicas: 2})",
        check=lambda s: not _separate(s) or s.roles.rollout is not None,
        cel=f"!{_SEPARATE_CEL} || has(self.roles.rollout)",
        field="roles.rollout",
    ),
    Rule(
        message="roles.rollout is unused: rollout.placement is colocated (the default); set rollout.placement: separate or remove the role",
        check=lambda s: s.roles.rollout is None or _separate(s),
        cel=f"!has(self.roles.rollout) || {_SEPARATE_CEL}",
        field="roles.rollout",
    ),
    Rule(
        message="algorithm.async generates ahead on ranks of their own: it needs rollout.placement: separate and roles.rollout",
        check=lambda s: s.algorithm.async_ is None or _separate(s),
        cel=f"!has(self.algorithm.async) || {_SEPARATE_CEL}",
        field="algorithm.async",
    ),
    Rule(
        message="rollout.placement: separate does not support rollout.multiTurn yet; use placement: colocated",
        check=lambda s: not _separate(s) or s.rollout.multi_turn is None,
        cel=f"!{_SEPARATE_CEL} || !has(self.rollout.multiTurn)",
        field="rollout.placement",
    ),
    Rule(
        message="rollout.placement: separate runs vLLM engines: set rollout.backend: vllm",
        check=lambda s: not _separate(s) or s.rollout.backend == "vllm",
        cel=f"!{_SEPARATE_CEL} || !has(self.rollout.backend) || self.rollout.backend == 'vllm'",
        field="rollout.placement",
    ),
    Rule(
        message=f"rollout.placement: separate runs the on_policy step only, for now: not {words(_NOT_SEPARATE_PRESETS)} "
        f"(another step) nor the {words(_GREEDY_ESTIMATORS)} estimator (a greedy draw per step); use placement: colocated",
        check=lambda s: not _separate(s) or _separate_algorithm_ok(s),
        cel=f"!{_SEPARATE_CEL} || ({_SEPARATE_ALGORITHM_CEL})",
        field="rollout.placement",
    ),
)


def _ranks_cel(role: str) -> str:
    own = (
        f"(has(self.roles.{role}.replicas) ? self.roles.{role}.replicas : 1)"
        f" * ((has(self.roles.{role}.gpusPerReplica) && self.roles.{role}.gpusPerReplica > 0)"
        f" ? self.roles.{role}.gpusPerReplica : 1)"
    )
    if role == "actor":
        return own
    return f"(has(self.roles.{role}.colocateWith) ? {_ranks_cel('actor')} : {own})"


def _dp_cel(role: str) -> str:
    return f"(has(self.roles.{role}.layout) ? self.roles.{role}.layout.dp : {_ranks_cel(role)})"


def _batch_rules(role: str) -> tuple[Rule, ...]:
    guard = "" if role == "actor" else f"!has(self.roles.{role}) || "
    present = (lambda s: True) if role == "actor" else (lambda s: getattr(s.roles, role) is not None)
    dp = lambda s: s.roles.layout(role).dp  # noqa: E731
    return (
        Rule(
            message=f"trainer.miniBatchSize must be a multiple of roles.{role} data-parallel size",
            check=lambda s: not present(s) or _mini_batch(s) % dp(s) == 0,
            cel=f"{guard}{_MINI_CEL} % {_dp_cel(role)} == 0",
            field="trainer.miniBatchSize",
            detail=lambda s: f"mini-batch {_mini_batch(s)} sequences, dp {dp(s)}",
        ),
        Rule(
            message=f"trainer.microBatchSize must divide the mini-batch's share of each roles.{role} data-parallel rank",
            check=lambda s: not present(s) or (_mini_batch(s) // dp(s)) % s.trainer.micro_batch_size == 0,
            cel=f"{guard}({_MINI_CEL} / {_dp_cel(role)}) % self.trainer.microBatchSize == 0",
            field="trainer.microBatchSize",
            detail=lambda s: f"{_mini_batch(s) // dp(s)} sequences per rank, microBatchSize {s.trainer.micro_batch_size}",
        ),
    )


class RLJobSpec(SpecModel):
    """An RL post-training job: model, data, algorithm, rewards, and the pods of each role."""

    model: ModelSpec
    tokenizer: TokenizerSpec | None = None
    """Leave out to use the model's own tokenizer."""
    data: DataSpec
    algorithm: AlgorithmSpec
    rollout: RolloutSpec | None = None
    """Generation settings (not for a preset that trains on given preference pairs: dpo)."""
    reward: RewardSpec | None = None
    """Required except for a preset that trains on preference pairs (dpo): its pairs are the signal."""
    roles: Roles
    trainer: TrainerSpec
    run_policy: RunPolicy = RunPolicy()
    monitoring: MonitoringSpec = MonitoringSpec()
    image: ImageReference | None = None
    """The trainer image; default: the one the operator was installed with."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    """When the kubelet pulls the image; default: the operator's setting (IfNotPresent)."""
    image_pull_secrets: list[LocalObjectReference] = Field(default=[], max_length=16)
    """Secrets, by name, for pulling the image."""
    service_account_name: DNSSubdomain | None = None
    """The pods' ServiceAccount; default: the job's own, which may only write the job's progress. With the chart's
    admission policy, naming one needs the right to create pods in the namespace."""
    volumes: list[Volume] = Field(
        default=[], max_length=64, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )
    """Volumes of the job's pods (PersistentVolumeClaims, ConfigMaps, Secrets, CSI, ...); each role mounts what it
    needs with its volumeMounts. On a cluster, every path the engine reads must lie under a mount of the role that reads it.
    Sources beyond persistentVolumeClaim, configMap, secret, emptyDir, ephemeral, projected, csi, image and downwardAPI
    (hostPath, gitRepo, nfs, ...) only where the chart allows them (admission.allowedVolumeSources); with its admission
    policy, every Secret named needs the right to get it."""
    cache: CacheSpec | None = None
    """Where hub downloads go on a cluster: needed by a job that names a hub repository (model.hubId, ...)."""
    initializer: InitializerSpec | None = None
    """Settings of the pod that fills the cache (environment such as HF_ENDPOINT, resources, deadline)."""

    RULES = (
        *SPEC_VOLUME_RULES,
        Rule(
            message="cache is unused: no hub repository to fetch (model.hubId, tokenizer.hubId or reward.model.hubId)",
            check=lambda s: s.cache is None or bool(s.hub_fields()),
            cel="!has(self.cache) || has(self.model.hubId) || (has(self.tokenizer) && has(self.tokenizer.hubId))"
            " || (has(self.reward) && has(self.reward.model) && has(self.reward.model.hubId))",
            field="cache",
        ),
        Rule(
            message="initializer needs cache: it fills the cache volume",
            check=lambda s: s.initializer is None or s.cache is not None,
            cel="!has(self.initializer) || has(self.cache)",
            field="initializer",
        ),
        Rule(
            message=f"{words(CRITIC_PRESETS)} needs roles.critic (an estimator that learns a value function: {words(CRITIC_ESTIMATORS)})",
            check=lambda s: not s.algorithm.needs_critic or s.roles.critic is not None,
            cel=f"!{needs_critic_cel('self.algorithm')} || has(self.roles.critic)",
            field="roles.critic",
        ),
        Rule(
            message=f"roles.critic is only used by {words(CRITIC_PRESETS)} (an estimator that learns a critic: {words(CRITIC_ESTIMATORS)})",
            check=lambda s: s.roles.critic is None or s.algorithm.needs_critic or s.algorithm.preset is None,
            cel=f"!has(self.roles.critic) || {needs_critic_cel('self.algorithm')} || !({cel_in('self.algorithm.name', PRESETS)})",
            field="roles.critic",
        ),
        Rule(
            message="the advantage estimator compares samples of one prompt (a group baseline): rollout.samplesPerPrompt must be at least 2",
            check=lambda s: s.algorithm.min_samples < 2 or s.rollout_or_default().samples_per_prompt >= 2,
            cel=f"!{group_baseline_cel('self.algorithm')} || (has(self.rollout) && self.rollout.samplesPerPrompt >= 2)",
            field="rollout.samplesPerPrompt",
            detail=lambda s: f"{s.algorithm.advantage_name} needs {s.algorithm.min_samples}",
        ),
        Rule(
            message=f"an option asks the estimator to compare a prompt's samples ({_GROUP_OPTIONS}), but with samplesPerPrompt 1 "
            "there is nothing to compare: set samplesPerPrompt >= 2, or leave the option out (its default follows samplesPerPrompt)",
            check=lambda s: not s.algorithm.group_option_set or s.rollout_or_default().samples_per_prompt >= 2,
            # The preset's block here; advantage.options are free values that CEL cannot read (checked by the parser).
            cel=f"!{group_option_cel('self.algorithm')} || (has(self.rollout) && self.rollout.samplesPerPrompt >= 2)",
            field="rollout.samplesPerPrompt",
        ),
        Rule(
            message=f"{_REFERENCE} needs roles.ref: its loss compares the policy with the reference policy (e.g. roles.ref: {{colocateWith: actor}})",
            check=lambda s: s.algorithm.preset is None or not s.algorithm.preset.needs_reference or s.roles.ref is not None,
            cel=f"!({cel_in('self.algorithm.name', REFERENCE_PRESETS)}) || has(self.roles.ref)",
            field="roles.ref",
        ),
        Rule(
            message="a KL term (algorithm.klCoef > 0) needs roles.ref, the reference policy (e.g. roles.ref: {colocateWith: actor})",
            check=lambda s: s.algorithm.pairs or s.algorithm.kl_coef <= 0 or s.roles.ref is not None,
            cel=f"{pairs_cel('self.algorithm')} || !(self.algorithm.klCoef > 0.0) || has(self.roles.ref)",
            field="roles.ref",
        ),
        Rule(
            message=f"roles.ref is unused: algorithm.klCoef is 0 and the preset is not one that compares with it ({_REFERENCE})",
            check=lambda s: s.roles.ref is None or s.algorithm.needs_reference or s.algorithm.preset is None,
            cel=f"!has(self.roles.ref) || {cel_in('self.algorithm.name', REFERENCE_PRESETS)} || self.algorithm.klCoef > 0.0"
            f" || !({cel_in('self.algorithm.name', PRESETS)})",
            field="roles.ref",
        ),
        Rule(
            message=f"{_PAIRS} trains on preference pairs and does not generate: remove rollout",
            check=lambda s: not s.algorithm.pairs or s.rollout is None,
            cel=f"!({pairs_cel('self.algorithm')}) || !has(self.rollout)",
            field="rollout",
        ),
        Rule(
            message=f"{_PAIRS} needs data.chosenField and data.rejectedField",
            check=lambda s: not s.algorithm.pairs or (s.data.chosen_field is not None and s.data.rejected_field is not None),
            cel=f"!({pairs_cel('self.algorithm')}) || (has(self.data.chosenField) && has(self.data.rejectedField))",
            field="data",
        ),
        Rule(
            message=f"data.chosenField and data.rejectedField apply only to {_PAIRS}",
            check=lambda s: s.algorithm.pairs or (s.data.chosen_field is None and s.data.rejected_field is None),
            cel=f"{pairs_cel('self.algorithm')} || (!has(self.data.chosenField) && !has(self.data.rejectedField))",
            field="data",
        ),
        Rule(
            message="reward is required: rules, a python file or a reward model",
            check=lambda s: s.algorithm.pairs or s.reward is not None,
            cel=f"{pairs_cel('self.algorithm')} || has(self.reward)",
            field="reward",
        ),
        Rule(
            message=f"{_PAIRS} takes no reward: its preference pairs are the signal",
            check=lambda s: not s.algorithm.pairs or s.reward is None,
            cel=f"!({pairs_cel('self.algorithm')}) || !has(self.reward)",
            field="reward",
        ),
        Rule(
            message="reward.model needs roles.reward to run it",
            check=lambda s: s.reward is None or s.reward.model is None or s.roles.reward is not None,
            cel="!has(self.reward) || !has(self.reward.model) || has(self.roles.reward)",
            field="roles.reward",
        ),
        Rule(
            message="roles.reward is unused: reward.model is not set",
            check=lambda s: s.roles.reward is None or (s.reward is not None and s.reward.model is not None),
            cel="!has(self.roles.reward) || (has(self.reward) && has(self.reward.model))",
            field="roles.reward",
        ),
        Rule(
            message="trainer.miniBatchSize must divide the sequences of a step, trainer.promptsPerStep * rollout.samplesPerPrompt",
            check=lambda s: _sequences_per_step(s) % _mini_batch(s) == 0,
            cel=f"({_SEQUENCES_CEL}) % {_MINI_CEL} == 0",
            field="trainer.miniBatchSize",
            detail=lambda s: f"{_sequences_per_step(s)} sequences per step, miniBatchSize {_mini_batch(s)}",
        ),
        *_batch_rules("actor"),
        *_batch_rules("critic"),
        *SEPARATE_RULES,
        Rule(
            message="rollout.multiTurn needs data.chatTemplate: true (tool calls and their results are chat messages)",
            check=lambda s: s.rollout is None or s.rollout.multi_turn is None or s.data.chat_template,
            cel="!has(self.rollout) || !has(self.rollout.multiTurn) || !has(self.data.chatTemplate) || self.data.chatTemplate",
            field="data.chatTemplate",
        ),
        Rule(
            message="trainer.validationInterval needs data.validation",
            check=lambda s: s.trainer.validation_interval == 0 or s.data.validation is not None,
            cel="self.trainer.validationInterval == 0 || has(self.data.validation)",
            field="trainer.validationInterval",
        ),
        Rule(
            message=f"monitoring.metricsPort {MASTER_PORT} is taken by torch.distributed's rendezvous",
            check=lambda s: s.monitoring.metrics_port != MASTER_PORT,
            cel=f"self.monitoring.metricsPort != {MASTER_PORT}",
            field="monitoring.metricsPort",
        ),
    )

    TRANSITION_RULES = tuple(_immutable(f) for f in IMMUTABLE_FIELDS)

    def hub_fields(self) -> list[str]:
        """The fields that name a hub repository (what the initializer fetches on a cluster)."""
        sources = {"model": self.model, "tokenizer": self.tokenizer, "reward.model": self.reward.model if self.reward else None}
        return [name for name, source in sources.items() if source is not None and source.hub_id is not None]

    def rollout_or_default(self) -> RolloutSpec:
        return self.rollout or RolloutSpec()
