"""The terms an update adds to its policy loss, each a function of the same `LossInputs`.

    L = L_policy + sum_k coef_k · agg(term_k)

The KL to the reference policy (algorithm.klCoef, klEstimator) and the entropy bonus
(entropyCoef, a negative coefficient) are terms; truncated importance sampling (algorithm.tis) is
the `is_weights` field the policy loss aggregates with. A term is aggregated as lossAggregation
says, and is not weighed by the importance weights (verl weighs only the policy loss's tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .registry import LossInputs
from .tensors import Aggregation, KLEstimator, aggregate, kl_estimate


@dataclass(frozen=True)
class Term:
    name: str
    """Its statistic's name (kl_loss, entropy)."""
    coef: float
    """Its weight in the loss; 0 computes the statistic only."""
    per_token: Callable[[LossInputs], torch.Tensor]
    aggregation: Aggregation

    def __call__(self, inputs: LossInputs) -> torch.Tensor:
        return aggregate(self.per_token(inputs), inputs.mask, self.aggregation, inputs.horizon)


def kl_term(coef: float, estimator: KLEstimator, aggregation: Aggregation) -> Term:
    """coef · KL(pi_theta || pi_ref), estimated per token (tensors.kl_estimate)."""

    def per_token(inputs: LossInputs) -> torch.Tensor:
        assert inputs.ref_logprobs is not None, "a KL term needs the reference policy's log-probs"
        return kl_estimate(inputs.logprobs, inputs.ref_logprobs, estimator)

    return Term("kl_loss", coef, per_token, aggregation)


def entropy_term(coef: float, aggregation: Aggregation) -> Term:
    """-coef · H(pi_theta): a bonus for the policy's entropy at the sampled positions."""

    def per_token(inputs: LossInputs) -> torch.Tensor:
        assert inputs.entropy is not None, "an entropy term needs the policy's entropy"
        return inputs.entropy

    return Term("entropy", -coef, per_token, aggregation)


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (Yao et al., 2025): min(pi_old / pi_rollout, cap) per token,
    detached, 0 outside the mask: the trainer's probability of a token over vLLM's, which sampled it."""
    return (torch.exp(torch.clamp(old_logprobs - rollout_logprobs, max=20.0)).clamp(max=cap) * mask).detach()
