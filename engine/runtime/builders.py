"""The parts of a run, one builder each: the model's files, the tokenizer, each role's model, the reward,
the rollout engine and the training->generation switch.

RLRun composes them on the actor's ranks; a reference or critic on ranks of its own (role_worker.py)
builds its model with the same function, so a role's model is the same wherever it runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch
from megatron.core import parallel_state as ps

from ..common.dtypes import torch_dtype, vllm_dtype
from ..config.topology import EngineConfig, policy_temperature
from ..distributed.role_link import RemoteRewardModel, RoleLink
from ..distributed.world import expert_parallel_ranks, model_parallel_ranks
from ..hybrid.reshard import Resharder
from ..models.arch import LlamaArch
from ..models.loading import read_hf_config
from ..models.lora_layout import adapter_config
from ..models.resolve import model_folder
from ..rewards import Rewarder
from ..tracking import Trackers, flat_params
from ..training.lora import AdapterOff
from ..training.packing import layout_options
from ..training.policy import MegatronLM, ModelPlace
from . import lora_run, multi_turn_run
from .checks import ConfigError
from .load_memory import loading

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..data import PromptEncoder
    from ..rollout.generation import Generator
    from ..rollout.switch import HybridSwitch
    from ..rollout.vllm_backend import VLLMRollout

log = logging.getLogger("kuberl.engine")


@dataclass(frozen=True)
class ModelFiles:
    """The policy's checkpoint on disk, and what every Megatron model of the job is built with."""

    folder: Path
    hf_config: dict[str, Any]
    arch: LlamaArch
    dtype: torch.dtype
    layout: dict[str, Any]
    """MegatronLM's layout arguments (packing, shared prompts): the same for every model of a job."""
    temperature: float
    """What the actor's and the reference's logits are divided by."""


def model_files(config: EngineConfig, base_dir: Path) -> ModelFiles:
    folder = model_folder(config.model, base_dir)
    hf_config = read_hf_config(folder)
    return ModelFiles(
        folder,
        hf_config,
        LlamaArch.from_hf_config(hf_config),
        torch_dtype(config.model.dtype),
        layout_options(config.trainer),
        policy_temperature(config),
    )


def build_tokenizer(config: EngineConfig, files: ModelFiles, base_dir: Path) -> PreTrainedTokenizerBase:
    """The job's tokenizer (the model's own unless `tokenizer` names another), with its chat template."""
    # transformers takes seconds to import: only a run that builds a tokenizer pays for it.
    from transformers import AutoTokenizer

    source = model_folder(config.tokenizer, base_dir) if config.tokenizer and config.tokenizer.source() else files.folder
    tokenizer = AutoTokenizer.from_pretrained(source)
    if config.tokenizer and config.tokenizer.chat_template:
        tokenizer.chat_template = config.tokenizer.chat_template
    return tokenizer


def build_actor(config: EngineConfig, files: ModelFiles, hf_state: Mapping[str, torch.Tensor]) -> MegatronLM:
    """The policy that trains: with an optimizer, and with adapters when the job trains LoRA."""
    trainer = config.trainer
    with loading("actor"):
        return MegatronLM(
            files.arch,
            hf_state,
            dtype=files.dtype,
            optimizer=trainer.optimizer,
            logit_temperature=files.temperature,
            lora=trainer.lora,
            lora_seed=trainer.seed,
            **files.layout,
        )


def build_reference(
    config: EngineConfig, files: ModelFiles, hf_state: Mapping[str, torch.Tensor], actor: MegatronLM | None = None
) -> MegatronLM | AdapterOff:
    """The frozen reference policy. A LoRA job's is its (colocated) `actor` with the adapter off: the base
    weights exist once (checks.py refuses a LoRA job's reference on ranks of its own)."""
    if config.trainer.lora is not None:
        assert actor is not None, "a LoRA job's reference is its actor's base"
        return AdapterOff(actor)
    with loading("ref"):
        return MegatronLM(files.arch, hf_state, dtype=files.dtype, logit_temperature=files.temperature, **files.layout)


def build_critic(config: EngineConfig, files: ModelFiles, hf_state: Mapping[str, torch.Tensor]) -> MegatronLM:
    """The value model: the policy's weights under a value head, with an optimizer of its own."""
    with loading("critic"):
        return MegatronLM(files.arch, hf_state, dtype=files.dtype, optimizer=config.trainer.optimizer, value_head=True, **files.layout)


def build_rewarder(config: EngineConfig, base_dir: Path, links: Mapping[str, RoleLink]) -> Rewarder | None:
    """The controller's scorer: the job's reward rules and, where the reward model runs on ranks of its
    own, that role over its link. None for a job that scores nothing (preference pairs)."""
    if config.reward is None or not config.algorithm.on_policy:
        return None
    remote = RemoteRewardModel(links["reward"]) if "reward" in links else None
    return Rewarder(config.reward, base_dir, remote_model=remote)


def build_resharder(files: ModelFiles, place: ModelPlace, tg: int) -> Resharder:
    """The training->generation switch for this rank's place in the actor's layout, for vLLM replicas
    of `tg` ranks; a layout it cannot serve is the job's error."""
    try:
        experts = (
            dict(
                ep=place.ep,
                ep_rank=place.ep_rank,
                expert_ranks=expert_parallel_ranks(),
                expert_group=ps.get_expert_tensor_model_pipeline_parallel_group(),
            )
            if files.arch.is_moe
            else {}
        )
        return Resharder(
            files.arch,
            place.tp,
            place.pp,
            place.pp_rank,
            place.tp_rank,
            model_parallel_ranks(),
            ps.get_model_parallel_group(),
            dtype=files.dtype,
            tg=tg,
            **experts,
        )
    except ValueError as exc:
        raise ConfigError(f"roles.actor.layout.rolloutTp: {exc}") from None


def build_trackers(config: EngineConfig, run_dir: Path, ids_dir: Path, resumed_at: int) -> Trackers | None:
    """The controller's experiment trackers (TensorBoard, MLflow, W&B), continuing a resumed job's runs
    from the step after `resumed_at`; None when the job tracks nothing."""
    if not config.tracking:
        return None
    return Trackers(
        config.tracking, job=config.job, run_dir=run_dir, ids_dir=ids_dir, params=flat_params(config.to_manifest()), resumed_at=resumed_at
    )


@dataclass(frozen=True)
class RolloutParts:
    """What a job that generates has beside its models."""

    rollout: VLLMRollout
    resharder: Resharder
    generator: Generator
    switch: HybridSwitch
    multi_turn: Any
    """The multi-turn rollout (tools, environments), or None."""


def build_rollout(
    config: EngineConfig,
    files: ModelFiles,
    actor: MegatronLM,
    critic: MegatronLM | None,
    agents: Any,
    encoder: PromptEncoder,
    stop_ids: tuple[int, ...],
    rank: int,
    world: int,
) -> RolloutParts:
    """vLLM replicas of rollout_tp consecutive ranks each (rollout_tp = 1: one per rank), the generator
    over them, and the switch that sends them the actor's weights (only its adapter with LoRA)."""
    # vLLM is imported only by a job that generates: a preference job runs without it.
    from ..rollout.generation import Generator
    from ..rollout.switch import HybridSwitch
    from ..rollout.vllm_backend import VLLMRollout

    spec, lora, seed = config.rollout, config.trainer.lora, config.trainer.seed
    assert spec is not None
    tp = config.roles["actor"].rollout_tp
    resharder = build_resharder(files, actor.place, tp)  # refuses a layout it cannot serve before vLLM starts
    rollout = VLLMRollout(
        files.folder,
        dtype=vllm_dtype(files.dtype),
        seed=seed + rank // tp,
        max_model_len=config.data.max_prompt_length + spec.max_response_tokens,
        kv_cache_bytes=spec.kv_cache_bytes,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        tensor_parallel_size=tp,
        skip_tokenizer_init=True,
        lora_rank=lora.rank if lora else None,
    )
    generator = Generator(rollout, rank, world, tp)
    multi_turn = multi_turn_run.multi_turn_rollout(agents, generator, encoder, config, stop_ids) if agents is not None else None
    adapter = lora_run.adapter_gather(files.arch, lora, actor.place) if lora else None
    switch = HybridSwitch(actor, critic, rollout, resharder, adapter, adapter_config(lora, str(files.folder)) if lora else None)
    return RolloutParts(rollout, resharder, generator, switch, multi_turn)
