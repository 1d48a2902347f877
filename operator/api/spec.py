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
from kuberl.engine.config.algorithm import group_baseline_cel, needs_critic_cel

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
    "model", "tokenizer", "data", "algorithm", "rollout", "reward", "roles", "trainer", "monitoring",
    "image", "imagePullPolicy", "imagePullSecrets", "serviceAccountName", "volumes", "cache", "initializer",
)


def _immutable(field: str) -> dict[str, str]:
    return {
        "rule": f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        "message": f"{field} cannot change once the RLJob exists (only runPolicy can): create a new RLJob",
        "fieldPath": f".{field}",
    }


def _reinforce_pp_baseline(s: "RLJobSpec") -> bool:
    """Whether the job asks for REINFORCE++'s group baseline explicitly (its block, or the estimator's options)."""
    algorithm = s.algorithm
    if algorithm.advantage is not None:
        return algorithm.advantage.name == "reinforce_pp" and algorithm.advantage.options.get("baseline") is True
    return algorithm.name == "reinforce_pp" and algorithm.reinforce_pp is not None and algorithm.reinforce_pp.baseline is True


def _sequences_per_step(s: "RLJobSpec") -> int:
    samples = 1 if s.algorithm.name == "dpo" else s.rollout_or_default().samples_per_prompt
    return s.trainer.prompts_per_step * samples


def _mini_batch(s: "RLJobSpec") -> int:
    return s.trainer.mini_batch_size or _sequences_per_step(s)


# CEL spellings of the two helpers above (defaults written out: the API server has applied the
# CRD's defaults before it evaluates a rule, but rollout itself may be absent).
_SAMPLES_CEL = "(self.algorithm.name == 'dpo' || !has(self.rollout) ? 1 : self.rollout.samplesPerPrompt)"
_SEQUENCES_CEL = f"self.trainer.promptsPerStep * {_SAMPLES_CEL}"
_MINI_CEL = f"(has(self.trainer.miniBatchSize) ? self.trainer.miniBatchSize : {_SEQUENCES_CEL})"


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
    """Generation settings (not for dpo, which does not generate)."""
    reward: RewardSpec | None = None
    """Required except for dpo, whose preference pairs are the signal."""
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
    """The pods' ServiceAccount; default: none mounted (the engine needs no API access)."""
    volumes: list[Volume] = Field(default=[], max_length=64, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """Volumes of the job's pods (PersistentVolumeClaims, ConfigMaps, Secrets, NFS, ...); each role mounts what it
    needs with its volumeMounts. On a cluster, every path the engine reads must lie under a mount of the role that reads it."""
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
            message="ppo needs roles.critic (GAE learns a value function)",
            check=lambda s: not s.algorithm.needs_critic or s.roles.critic is not None,
            cel=f"!{needs_critic_cel('self.algorithm')} || has(self.roles.critic)",
            field="roles.critic",
        ),
        Rule(
            message="roles.critic is only used by ppo (an estimator that learns a critic: gae)",
            check=lambda s: s.roles.critic is None or s.algorithm.needs_critic,
            cel=f"!has(self.roles.critic) || {needs_critic_cel('self.algorithm')}",
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
            message="reinforce_pp's baseline subtracts the mean of a prompt's samples: with samplesPerPrompt 1 every advantage "
            "is 0; set samplesPerPrompt >= 2, or leave the baseline out (its default follows samplesPerPrompt)",
            check=lambda s: not _reinforce_pp_baseline(s) or s.rollout_or_default().samples_per_prompt >= 2,
            # The preset's block here; advantage.options are free values that CEL cannot read (checked by the parser).
            cel="self.algorithm.name != 'reinforce_pp' || has(self.algorithm.advantage)"
            " || !has(self.algorithm.reinforcePp) || !has(self.algorithm.reinforcePp.baseline) || !self.algorithm.reinforcePp.baseline"
            " || (has(self.rollout) && self.rollout.samplesPerPrompt >= 2)",
            field="rollout.samplesPerPrompt",
        ),
        Rule(
            message="dpo needs roles.ref: its loss compares the policy with the reference policy (e.g. roles.ref: {colocateWith: actor})",
            check=lambda s: s.algorithm.name != "dpo" or s.roles.ref is not None,
            cel="self.algorithm.name != 'dpo' || has(self.roles.ref)",
            field="roles.ref",
        ),
        Rule(
            message="a KL term (algorithm.klCoef > 0) needs roles.ref, the reference policy (e.g. roles.ref: {colocateWith: actor})",
            check=lambda s: s.algorithm.name == "dpo" or s.algorithm.kl_coef <= 0 or s.roles.ref is not None,
            cel="self.algorithm.name == 'dpo' || !(self.algorithm.klCoef > 0.0) || has(self.roles.ref)",
            field="roles.ref",
        ),
        Rule(
            message="roles.ref is unused: algorithm.klCoef is 0 and the algorithm is not dpo",
            check=lambda s: s.roles.ref is None or s.algorithm.needs_reference,
            cel="!has(self.roles.ref) || self.algorithm.name == 'dpo' || self.algorithm.klCoef > 0.0",
            field="roles.ref",
        ),
        Rule(
            message="dpo trains on preference pairs and does not generate: remove rollout",
            check=lambda s: s.algorithm.name != "dpo" or s.rollout is None,
            cel="self.algorithm.name != 'dpo' || !has(self.rollout)",
            field="rollout",
        ),
        Rule(
            message="dpo needs data.chosenField and data.rejectedField",
            check=lambda s: s.algorithm.name != "dpo" or (s.data.chosen_field is not None and s.data.rejected_field is not None),
            cel="self.algorithm.name != 'dpo' || (has(self.data.chosenField) && has(self.data.rejectedField))",
            field="data",
        ),
        Rule(
            message="data.chosenField and data.rejectedField apply only to dpo",
            check=lambda s: s.algorithm.name == "dpo" or (s.data.chosen_field is None and s.data.rejected_field is None),
            cel="self.algorithm.name == 'dpo' || (!has(self.data.chosenField) && !has(self.data.rejectedField))",
            field="data",
        ),
        Rule(
            message="reward is required: rules, a python file or a reward model",
            check=lambda s: s.algorithm.name == "dpo" or s.reward is not None,
            cel="self.algorithm.name == 'dpo' || has(self.reward)",
            field="reward",
        ),
        Rule(
            message="dpo takes no reward: its preference pairs are the signal",
            check=lambda s: s.algorithm.name != "dpo" or s.reward is None,
            cel="self.algorithm.name != 'dpo' || !has(self.reward)",
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
