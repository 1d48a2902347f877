"""The loss functions a job's models train with, built from its algorithm spec.

Each takes the last pipeline stage's output at the response tokens (vocab-parallel logits [N, v/tp]
for the policy, values [N] for the critic, policy.LossFn), a micro-batch and its update's totals, and returns (loss,
stats): the loss scaled to the micro-batch's part of its mini-batch (loss_scale.py), the stats
of the micro-batch alone. The actor's ranks
and a critic on ranks of its own build them from the same spec.
"""

from __future__ import annotations

import torch

from .. import algorithms as A
from ..config.algorithm import AlgorithmSpec, PPOSpec
from .loss_scale import UpdateTotals
from .policy import LossFn, response_logprobs_from_logits, vocab_parallel_entropy
from .sequences import SeqBatch, on_response_grid


def policy_loss_fn(algorithm: AlgorithmSpec, horizon: int) -> LossFn:
    """The algorithm's registered policy loss, plus a KL loss against the reference and an entropy
    bonus when asked for. `horizon`: the rollout's maxNewTokens, the constant width that
    seq_mean_token_sum_norm divides by."""
    kl_loss = algorithm.kl_coef > 0 and not algorithm.kl_in_reward and algorithm.name != "dpo"
    choice = A.choice_of(algorithm)
    surrogate = A.policy_loss_entry(choice.policy_loss)
    aggregation = choice.policy_loss_options.get("aggregation", surrogate.options.get("aggregation"))
    width = horizon if aggregation == "seq_mean_token_sum_norm" else None
    tis_cap = algorithm.tis.cap if algorithm.tis is not None else None
    term_width = horizon if algorithm.loss_aggregation == "seq_mean_token_sum_norm" else None

    def term(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The KL and entropy terms, aggregated as lossAggregation says."""
        return A.aggregate(_widen(values, term_width), _widen(mask, term_width), algorithm.loss_aggregation)

    def loss_fn(logits: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
        logp = response_logprobs_from_logits(logits, mb)
        advantages = mb.advantages
        stats = mismatch_stats(logp.detach(), mb.rollout_logprobs, mb.mask) if mb.rollout_logprobs is not None else {}
        if tis_cap is not None:
            # Truncated importance sampling: every loss is linear in a token's advantage and a
            # weight >= 0 commutes with its clipping, so weighing the advantage weighs the token.
            weight = torch.exp(torch.clamp(mb.old_logprobs - mb.rollout_logprobs, max=20.0)).clamp(max=tis_cap) * mb.mask
            advantages = advantages * weight
            stats["tis_weight_mean"] = A.masked_mean(weight, mb.mask).detach()
        args = [logp, mb.old_logprobs, advantages, mb.mask]
        loss, st = surrogate.fn(*(_widen(t, width) for t in args), **choice.policy_loss_options)
        stats.update({"policy_loss": loss.detach(), **st})
        loss = loss * totals.scale(mb, aggregation)
        term_scale = totals.scale(mb, algorithm.loss_aggregation)
        if kl_loss:
            kl = A.kl_estimate(logp, mb.ref_logprobs, algorithm.kl_estimator)
            kl_term = term(kl, mb.mask)
            loss = loss + algorithm.kl_coef * term_scale * kl_term
            stats["kl_loss"] = kl_term.detach()
        want_grad = algorithm.entropy_coef > 0
        with torch.set_grad_enabled(want_grad and torch.is_grad_enabled()):
            entropy = on_response_grid(vocab_parallel_entropy(logits), mb) * mb.mask
            ent = term(entropy, mb.mask)
        if want_grad:
            loss = loss - algorithm.entropy_coef * term_scale * ent
        stats["entropy"] = ent.detach()
        return loss, stats

    return loss_fn


def _widen(t: torch.Tensor, width: int | None) -> torch.Tensor:
    """[B, R] zero-padded on the right to `width` columns (masked out, so they add nothing but the divisor)."""
    if width is None or t.shape[-1] >= width:
        return t
    return torch.nn.functional.pad(t, (0, width - t.shape[-1]))


MISMATCH_KEYS = ("rollout/mismatch_kl", "rollout/mismatch_max")


def mismatch_stats(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """vLLM's against the trainer's log-probs of the same sampled tokens: KL(vLLM || trainer) by k3
    (the samples are vLLM's) and the largest absolute difference."""
    gap = ((rollout - train).abs() * mask).max() if mask.numel() else torch.tensor(0.0)
    return {MISMATCH_KEYS[0]: A.masked_mean(A.kl_estimate(rollout, train, "k3"), mask), MISMATCH_KEYS[1]: gap}


def value_loss_fn(algorithm: AlgorithmSpec) -> LossFn:
    """The critic's (optionally clipped) value loss, scaled by the PPO value-loss coefficient."""
    ppo = algorithm.ppo or PPOSpec()

    def loss_fn(values: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
        v = on_response_grid(values.float(), mb) * mb.mask
        loss = A.value_loss(v, mb.old_values, mb.returns, mb.mask, ppo.value_clip, algorithm.loss_aggregation)
        scale = totals.scale(mb, algorithm.loss_aggregation)
        return loss * ppo.value_loss_coef * scale, {"value_loss": loss.detach()}

    return loss_fn
