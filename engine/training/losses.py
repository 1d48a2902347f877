"""The loss functions a job's models train with, built from its algorithm spec.

Each takes the last pipeline stage's output at the response tokens (vocab-parallel logits [N, v/tp]
for the policy, values [N] for the critic, policy.LossFn), a micro-batch and its update's totals, and
returns (loss, stats): the loss scaled to the micro-batch's part of its mini-batch (loss_scale.py), the
stats of the micro-batch alone. The policy's loss is a registered loss over a `LossInputs` record
plus the terms (algorithms/terms.py): the KL to the reference and the entropy bonus; truncated
importance sampling is the record's importance weights. The actor's ranks and a critic on ranks of
its own build them from the same spec.
"""

from __future__ import annotations

import torch

from .. import algorithms as A
from ..algorithms.presets import AlgorithmChoice
from ..config.algorithm import AlgorithmSpec
from .loss_scale import UpdateTotals
from .policy import LossFn, response_logprobs_from_logits, vocab_parallel_entropy
from .sequences import SeqBatch, on_response_grid


def job_terms(algorithm: AlgorithmSpec) -> list[A.Term]:
    """The KL term (klCoef > 0, not in the reward) and the entropy term (its statistic always, its
    gradient when entropyCoef > 0), aggregated as lossAggregation says."""
    terms = []
    if algorithm.kl_coef > 0 and not algorithm.kl_in_reward and not algorithm.pairs:
        terms.append(A.kl_term(algorithm.kl_coef, algorithm.kl_estimator, algorithm.loss_aggregation))
    terms.append(A.entropy_term(algorithm.entropy_coef, algorithm.loss_aggregation))
    return terms


def policy_loss_fn(algorithm: AlgorithmSpec, horizon: int, choice: AlgorithmChoice | None = None) -> LossFn:
    """The registered policy loss `choice` names (default: the algorithm's), plus the job's terms.
    `horizon`: the rollout's maxNewTokens, seq_mean_token_sum_norm's constant unless
    algorithm.lossScaleFactor sets another."""
    choice = choice or A.choice_of(algorithm)
    surrogate = A.policy_loss_entry(choice.policy_loss)
    options = choice.policy_loss_options
    aggregation = options.get("aggregation", surrogate.options.get("aggregation"))
    horizon = algorithm.loss_scale_factor or horizon
    tis_cap = algorithm.tis.cap if algorithm.tis is not None and not surrogate.corrects_rollout else None
    terms = job_terms(algorithm)
    entropy_grad = algorithm.entropy_coef > 0

    def loss_fn(logits: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
        logp = response_logprobs_from_logits(logits, mb)
        old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
        stats = mismatch_stats(logp.detach(), mb.rollout_logprobs, mb.mask) if mb.rollout_logprobs is not None else {}
        weights = None
        if tis_cap is not None:
            weights = A.tis_weights(old, mb.rollout_logprobs, mb.mask, tis_cap)
            stats["tis_weight_mean"] = A.masked_mean(weights, mb.mask)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = on_response_grid(vocab_parallel_entropy(logits), mb) * mb.mask
        inputs = A.LossInputs(
            logprobs=logp,
            old_logprobs=old,
            mask=mb.mask,
            advantages=mb.advantages if mb.advantages is not None else torch.zeros_like(mb.mask),
            ref_logprobs=mb.ref_logprobs,
            rollout_logprobs=mb.rollout_logprobs,
            is_weights=weights,
            entropy=entropy,
            horizon=horizon,
            global_tokens=totals.tokens,
            global_sequences=float(totals.sequences),
        )
        loss, st = surrogate.fn(inputs, **options)
        stats.update({"policy_loss": loss.detach(), **st})
        total = loss * totals.scale(mb, aggregation)
        for term in terms:
            value = term(inputs)
            stats[term.name] = value.detach()
            if term.coef != 0:
                total = total + term.coef * totals.scale(mb, term.aggregation) * value
        return total, stats

    return loss_fn


MISMATCH_KEYS = ("rollout/mismatch_kl", "rollout/mismatch_max")


def mismatch_stats(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """vLLM's against the trainer's log-probs of the same sampled tokens: KL(vLLM || trainer) by k3
    (the samples are vLLM's) and the largest absolute difference."""
    gap = ((rollout - train).abs() * mask).max() if mask.numel() else torch.tensor(0.0)
    return {MISMATCH_KEYS[0]: A.masked_mean(A.kl_estimate(rollout, train, "k3"), mask), MISMATCH_KEYS[1]: gap}


def value_loss_fn(algorithm: AlgorithmSpec, horizon: int | None = None) -> LossFn:
    """The critic's (optionally clipped) value loss, scaled by the value-loss coefficient (the
    critic's options sit in the ppo block, the preset that trains one)."""
    critic = algorithm.block("ppo")
    clip, coef = (critic.value_clip, critic.value_loss_coef) if critic is not None else (0.2, 0.5)
    horizon = algorithm.loss_scale_factor or horizon

    def loss_fn(values: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
        v = on_response_grid(values.float(), mb) * mb.mask
        loss, stats = A.value_loss(v, mb.old_values, mb.returns, mb.mask, clip, algorithm.loss_aggregation, horizon)
        scale = totals.scale(mb, algorithm.loss_aggregation)
        return loss * coef * scale, {"value_loss": loss.detach(), **stats}

    return loss_fn
