"""The loss functions a job's models train with, built from its algorithm spec.

Each takes the last pipeline stage's output at the response positions (vocab-parallel logits for
the policy, values for the critic) and a micro-batch, and returns (loss, stats). The actor's ranks
and a critic on ranks of its own build them from the same spec.
"""

from __future__ import annotations

import torch

from .. import algorithms as A
from ..config.algorithm import AlgorithmSpec, PPOSpec
from .policy import LossFn, response_logprobs_from_logits, vocab_parallel_entropy
from .sequences import SeqBatch


def policy_loss_fn(algorithm: AlgorithmSpec) -> LossFn:
    """The algorithm's registered policy loss, plus a KL loss against the reference and an entropy bonus when asked for."""
    kl_loss = algorithm.kl_coef > 0 and not algorithm.kl_in_reward and algorithm.name != "dpo"
    choice = A.choice_of(algorithm)
    surrogate = A.policy_loss_entry(choice.policy_loss)

    def loss_fn(logits: torch.Tensor, mb: SeqBatch):
        logp = response_logprobs_from_logits(logits, mb)
        loss, st = surrogate.fn(logp, mb.old_logprobs, mb.advantages, mb.mask, **choice.policy_loss_options)
        stats = {"policy_loss": loss.detach(), **st}
        if kl_loss:
            kl = A.kl_estimate(logp, mb.ref_logprobs, algorithm.kl_estimator)
            kl_term = A.aggregate(kl, mb.mask, algorithm.loss_aggregation)
            loss = loss + algorithm.kl_coef * kl_term
            stats["kl_loss"] = kl_term.detach()
        want_grad = algorithm.entropy_coef > 0
        with torch.set_grad_enabled(want_grad and torch.is_grad_enabled()):
            entropy = vocab_parallel_entropy(logits) * mb.mask
            ent = A.aggregate(entropy, mb.mask, algorithm.loss_aggregation)
        if want_grad:
            loss = loss - algorithm.entropy_coef * ent
        stats["entropy"] = ent.detach()
        return loss, stats

    return loss_fn


def value_loss_fn(algorithm: AlgorithmSpec) -> LossFn:
    """The critic's (optionally clipped) value loss, scaled by the PPO value-loss coefficient."""
    ppo = algorithm.ppo or PPOSpec()

    def loss_fn(values: torch.Tensor, mb: SeqBatch):
        v = values.float() * mb.mask
        loss = A.value_loss(v, mb.old_values, mb.returns, mb.mask, ppo.value_clip, algorithm.loss_aggregation)
        return loss * ppo.value_loss_coef, {"value_loss": loss.detach()}

    return loss_fn
