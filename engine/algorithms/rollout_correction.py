"""The bypass mode of rollout correction: the rollout engine's log-probs stand for the old policy's.

The trainer then needs no forward of the old policy: the ratio of a token is
r = pi_theta / pi_rollout, and its mismatch with the trainer is corrected by that ratio itself, not
by a separate weight. As verl's bypass_mode policy loss, in two forms:

    ppoClip:   PPO's clipped surrogate with r = exp(log pi_theta - log pi_rollout), and its dual clip
               where A < 0 when dualClip is set (as ppo_clip's); no other weight
    reinforce: L_t = -A_t · w_t · log pi_theta(t),  w = sg(min(rho, isThreshold))
               rho per token: exp(l_t),  l_t = log pi_theta(t) - log pi_rollout(t)   (rolloutIs: token)
               per response:  exp(sum_t l_t)                                          (rolloutIs: sequence)
               (log-ratios clamped to ±20; rolloutIs: none is w = 1, plain REINFORCE)
               isBatchNormalize: w / mean(w) after the cap, the mean over the micro-batch's tokens
               (token) or its responses' mean weights (sequence)

Rejection sampling (rolloutRs, both forms) drops tokens, or whole responses, whose divergence from
the rollout is past rsThreshold. With l~_t = clamp(l_t, ±20): k1 = -l~ (log pi_rollout / pi_theta),
k2 = l~²/2, k3 = exp(l~) - 1 - l~; token_* judges each token, seq_sum_*, seq_mean_* and seq_max_*
the sum, mean or max over a response. A k1 statistic is kept within [-log U, log U] (the ratio
within [1/U, U]), a k2 or k3 one at or below U. A rejected token leaves the loss's numerator, not its
denominator (the update's token and response counts are those before rejection, as in verl).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from ..config.options import Bound
from .policy_losses import _DUAL_CLIP, _LOWER, _POSITIVE, clipped_surrogate, dual_clipped
from .registry import LossInputs, LossResult, register_policy_loss
from .tensors import Aggregation, aggregate, masked_mean, masked_sum

RejectionMode = Literal[
    "none",
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
]


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


def batch_normalized(weights: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """`weights` divided by their mean: over the masked tokens (token level), or over the responses'
    mean weights, counting responses with at least one token (sequence level). A mean of 1e-8 or
    less leaves them as they are."""
    if level == "sequence":
        rows = mask.sum(-1) > 0
        mean = masked_mean(weights, mask, dim=-1)[rows].mean() if bool(rows.any()) else weights.new_tensor(0.0)
    else:
        mean = masked_mean(weights, mask)
    return weights / mean if float(mean) > 1e-8 else weights


def rejection_mask(lr: torch.Tensor, mask: torch.Tensor, mode: str, threshold: float) -> torch.Tensor:
    """[B, T] 1 where a token is kept, 0 where rolloutRs rejects it (or it lies outside the mask);
    `lr` is the clamped log-ratio log pi_theta - log pi_rollout, detached."""
    if mode == "none":
        return mask
    level, _, stat = mode.rpartition("_")
    per_token = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}[stat]
    if level == "token":
        value = per_token
    elif level == "seq_sum":
        value = masked_sum(per_token, mask, dim=-1)[:, None]
    elif level == "seq_mean":
        value = masked_mean(per_token, mask, dim=-1)[:, None]
    elif level == "seq_max":
        value = per_token.masked_fill(mask == 0, float("-inf")).amax(-1, keepdim=True)
    else:
        raise ValueError(f"unknown rolloutRs {mode!r}")
    if stat == "k1":
        if threshold <= 1.0:
            raise ValueError(
                f"rsThreshold must be above 1 for rolloutRs {mode} (the ratio is kept within [1/rsThreshold, rsThreshold]), got {threshold}"
            )
        bound = torch.log(torch.tensor(threshold, dtype=value.dtype))
        keep = (value >= -bound) & (value <= bound)
    else:
        keep = value <= threshold
    return mask * keep.to(mask.dtype)


def aggregate_kept(loss: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor, mode: Aggregation, horizon: int | None) -> torch.Tensor:
    """`aggregate` of the kept tokens' losses with the counts before rejection; seq_mean_token_mean
    averages a response over its kept tokens (verl's agg_loss with the rejection as its mask)."""
    if mode == "seq_mean_token_mean":
        rows = (mask.sum(-1) > 0).sum().clamp(min=1).to(loss.dtype)
        return masked_mean(loss, kept, dim=-1).sum() / rows
    return aggregate(loss * kept, mask, mode, horizon)


@register_policy_loss(
    "bypass",
    corrects_rollout=True,
    summary="rollout correction without an old-policy forward: vLLM's log-probs as the old policy's (bypass mode)",
)
def bypass(
    inputs: LossInputs,
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip",
    rollout_is: Literal["token", "sequence", "none"] = "token",
    is_threshold: Annotated[float, Bound(gt=0.0, why="a weight's upper bound")] = 2.0,
    is_batch_normalize: bool = False,
    rollout_rs: RejectionMode = "none",
    rs_threshold: Annotated[float, Bound(gt=0.0, why="the largest divergence kept")] = 2.0,
    clip_low: Annotated[float, _LOWER] = 0.2,
    clip_high: Annotated[float | None, _POSITIVE] = None,
    aggregation: Aggregation = "token_mean",
    dual_clip: Annotated[float | None, _DUAL_CLIP] = None,
) -> LossResult:
    """The bypass mode (module docstring). Needs the rollout's log-probs (on-policy presets); with
    oldLogprobs: recompute the recomputed ones are not used by this loss. dual_clip applies to
    lossType ppo_clip only, as verl's bypass mode applies its vanilla loss's clip_ratio_c there."""
    if inputs.rollout_logprobs is None:
        raise ValueError("the bypass loss needs the rollout's log-probs (a job that generates)")
    lr = torch.clamp(inputs.logprobs - inputs.rollout_logprobs, -20.0, 20.0)
    kept = rejection_mask(lr.detach(), inputs.mask, rollout_rs, rs_threshold)
    stats = {
        "approx_kl": masked_mean(-lr, inputs.mask).detach(),
        "rs_kept_fraction": (kept.sum() / inputs.mask.sum().clamp(min=1)).detach(),
    }
    if loss_type == "ppo_clip":
        clip_high = clip_low if clip_high is None else clip_high
        loss, clipped = clipped_surrogate(torch.exp(lr), inputs.advantages, clip_low, clip_high)
        # The fractions count the kept tokens: verl hands its vanilla loss the mask after rejection.
        loss, lower = dual_clipped(loss, inputs.advantages, kept, dual_clip)
        stats.update(clip_fraction=masked_mean(clipped.float(), kept).detach(), **lower)
    elif loss_type == "reinforce":
        weights = rollout_is_weights(inputs, rollout_is, is_threshold)
        if is_batch_normalize:
            weights = batch_normalized(weights, inputs.mask, rollout_is)
        loss = -inputs.advantages * inputs.logprobs * weights
        stats["is_weight_mean"] = masked_mean(weights, inputs.mask).detach()
    else:
        raise ValueError(f"unknown lossType {loss_type!r}: ppo_clip or reinforce")
    # Its own correction: no further importance weights (algorithm.tis is refused with this loss).
    return aggregate_kept(loss, inputs.mask, kept, aggregation, inputs.horizon), stats
