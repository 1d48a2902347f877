"""The bypass mode of rollout correction: the rollout engine's log-probs stand for the old policy's.

The trainer then needs no forward of the old policy: the ratio of a token is
pi_theta / pi_rollout, and its mismatch with the trainer is corrected by that ratio itself, not by
a separate weight. As verl's bypass_mode policy loss, in two forms:

    ppoClip:   PPO's clipped surrogate with r = exp(log pi_theta - log pi_rollout); no other weight
    reinforce: L_t = -A_t · w_t · log pi_theta(t),  w = sg(min(rho, isThreshold))
               rho per token: exp(log pi_theta(t) - log pi_rollout(t))       (rolloutIs: token)
               per response:  exp(sum_t (log pi_theta(t) - log pi_rollout(t)))  (rolloutIs: sequence)
               (log-ratios clamped to ±20; rolloutIs: none is w = 1, plain REINFORCE)

verl's optional rejection sampling of whole responses and weight normalisation are not here.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from ..config.options import Bound
from .policy_losses import _LOWER, _POSITIVE, clipped_surrogate
from .registry import LossInputs, LossResult, register_policy_loss
from .tensors import Aggregation, aggregate, masked_mean, masked_sum


def rollout_is_weights(inputs: LossInputs, level: str, threshold: float) -> torch.Tensor:
    """[B, T] detached, truncated importance weights pi_theta / pi_rollout (0 outside the mask)."""
    assert inputs.rollout_logprobs is not None
    lr = inputs.logprobs.detach() - inputs.rollout_logprobs
    if level == "none":
        return inputs.mask.to(lr.dtype)
    if level == "token":
        rho = torch.exp(torch.clamp(lr, -20.0, 20.0))
    elif level == "sequence":
        rho = torch.exp(torch.clamp(masked_sum(lr, inputs.mask, dim=-1), -20.0, 20.0))[:, None].expand_as(lr)
    else:
        raise ValueError(f"unknown rolloutIs {level!r}: token, sequence or none")
    return (rho * inputs.mask).clamp(max=threshold)


@register_policy_loss("bypass", corrects_rollout=True,
                      summary="rollout correction without an old-policy forward: vLLM's log-probs as the old policy's (bypass mode)")
def bypass(inputs: LossInputs, loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip",
           rollout_is: Literal["token", "sequence", "none"] = "token",
           is_threshold: Annotated[float, Bound(gt=0.0, why="a weight's upper bound")] = 2.0,
           clip_low: Annotated[float, _LOWER] = 0.2, clip_high: Annotated[float | None, _POSITIVE] = None,
           aggregation: Aggregation = "token_mean") -> LossResult:
    """The bypass mode (module docstring). Needs the rollout's log-probs (on-policy presets); with
    oldLogprobs: recompute the recomputed ones are not used by this loss."""
    if inputs.rollout_logprobs is None:
        raise ValueError("the bypass loss needs the rollout's log-probs (a job that generates)")
    lr = torch.clamp(inputs.logprobs - inputs.rollout_logprobs, -20.0, 20.0)
    stats = {"approx_kl": masked_mean(-lr, inputs.mask).detach()}
    if loss_type == "ppo_clip":
        clip_high = clip_low if clip_high is None else clip_high
        loss, clipped = clipped_surrogate(torch.exp(lr), inputs.advantages, clip_low, clip_high)
        stats["clip_fraction"] = masked_mean(clipped.float(), inputs.mask).detach()
    elif loss_type == "reinforce":
        weights = rollout_is_weights(inputs, rollout_is, is_threshold)
        loss = -inputs.advantages * inputs.logprobs * weights
        stats["is_weight_mean"] = masked_mean(weights, inputs.mask).detach()
    else:
        raise ValueError(f"unknown lossType {loss_type!r}: ppo_clip or reinforce")
    # Its own correction: no further importance weights (algorithm.tis is refused with this loss).
    return aggregate(loss, inputs.mask, aggregation, inputs.horizon), stats
