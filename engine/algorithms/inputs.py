"""What the registered functions read: an estimator's `AdvantageInputs`, a loss's `LossInputs`.

Typed records, so that a function says what it reads by the fields it uses, and a new input is
one more field here rather than one more positional argument in every function. Shapes: [B] per
response, [B, T] per token of the responses, padded on the right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .tensors import Aggregation, aggregate


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator sees of one step: [B] per response, [B, T] per token."""

    scores: torch.Tensor
    """The reward of each response."""
    group: torch.Tensor
    """Responses of the same prompt share a group id."""
    mask: torch.Tensor
    """1 on response tokens."""
    values: torch.Tensor | None = None
    """The critic's values of the response tokens (estimators that need a critic)."""
    kl_penalty: torch.Tensor | None = None
    """klCoef * KL per token when the KL is in the reward (klInReward); subtracted from token rewards."""
    greedy_scores: torch.Tensor | None = None
    """[B] the reward of a greedy response to each response's prompt (estimators with needs_greedy)."""
    old_logprobs: torch.Tensor | None = None
    """[B, T] the old policy's log-probs of the sampled tokens."""
    sum_pi_squared: torch.Tensor | None = None
    """[B, T] sum over the vocabulary of the old policy's squared probabilities at each token
    (estimators with needs_pi_squared: the step computes it with one more forward of the actor)."""
    is_weights: torch.Tensor | None = None
    """[B, T] the truncated importance weights of the rollout's tokens when algorithm.tis is set."""
    reward_parts: dict[str, torch.Tensor] = field(default_factory=dict)
    """[B] each reward source's own (unweighted) reward, by source name (rule name, python:fn, model)."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """The weight of each reward source in `scores`."""


@dataclass(frozen=True)
class Advantages:
    advantages: torch.Tensor
    """[B, T], 0 outside the mask."""
    returns: torch.Tensor | None = None
    """[B, T] value targets for the critic, from estimators that use one."""


@dataclass(frozen=True)
class LossInputs:
    """Everything a policy loss may read of one micro-batch. Per token [B, T], 0 outside `mask`."""

    logprobs: torch.Tensor
    """The policy's log-probs of the sampled tokens, with their gradient."""
    old_logprobs: torch.Tensor
    """The old policy's (algorithm.oldLogprobs: vLLM's, or recomputed by the trainer)."""
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    """The reference policy's, when the job has one."""
    rollout_logprobs: torch.Tensor | None = None
    """vLLM's, when the tokens were sampled by the job's rollout (not for given preference pairs)."""
    is_weights: torch.Tensor | None = None
    """Detached importance weights of the rollout's tokens (algorithm.tis); `aggregate` applies them."""
    entropy: torch.Tensor | None = None
    """The policy's entropy at each token (with its gradient when entropyCoef > 0)."""
    horizon: int | None = None
    """The constant of seq_mean_token_sum_norm (algorithm.lossScaleFactor or rollout.maxNewTokens)."""
    global_tokens: float | None = None
    """Response tokens of the whole update (the mini-batch, every DP rank's rows)."""
    global_sequences: float | None = None
    """Responses (with at least one token) of the whole update."""

    @property
    def lengths(self) -> torch.Tensor:
        """[B] the number of tokens of each response."""
        return self.mask.sum(-1)

    def weigh(self, per_token: torch.Tensor) -> torch.Tensor:
        """`per_token` times the importance weights, where the job has them."""
        return per_token if self.is_weights is None else per_token * self.is_weights

    def aggregate(self, per_token: torch.Tensor, mode: Aggregation) -> torch.Tensor:
        """One number of per-token losses: weighed by `is_weights` (verl applies its rollout
        correction weights to each loss's tokens alike), then aggregated over this micro-batch."""
        return aggregate(self.weigh(per_token), self.mask, mode, self.horizon)
