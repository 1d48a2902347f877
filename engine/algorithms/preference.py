"""Preference losses: DPO over pairs of sequence log-probs, registered as a loss over row pairs."""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F

from ..config.options import Bound
from .registry import LossInputs, LossResult, register_policy_loss
from .tensors import masked_sum


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO's sigmoid loss over preference pairs (sequence log-probs [N]); returns (mean loss, stats).

    With label smoothing eps (conservative DPO) a label is assumed flipped with probability eps.
    """
    chosen_reward = beta * (chosen_logps - ref_chosen_logps)
    rejected_reward = beta * (rejected_logps - ref_rejected_logps)
    margin = chosen_reward - rejected_reward
    losses = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)
    stats = {
        "reward_accuracy": (margin > 0).float().mean().detach(),
        "reward_margin": margin.mean().detach(),
        "chosen_reward": chosen_reward.mean().detach(),
        "rejected_reward": rejected_reward.mean().detach(),
    }
    return losses.mean(), stats


@register_policy_loss("dpo", pairs=True, summary="DPO's sigmoid loss over (chosen, rejected) pairs against the reference policy")
def dpo(
    inputs: LossInputs,
    beta: Annotated[float, Bound(gt=0.0, why="beta scales the implicit KL constraint")] = 0.1,
    label_smoothing: Annotated[float, Bound(ge=0.0, lt=0.5, why="at 0.5 every pair is uninformative")] = 0.0,
) -> LossResult:
    """Direct Preference Optimization (Rafailov et al., 2023) over the micro-batch's rows, which come
    in pairs: row 2k is a chosen response, row 2k + 1 the rejected one of the same prompt. With
    s(y) = sum_t log pi(y_t) the sequence log-prob,
    m = beta · [(s_theta(y_w) - s_ref(y_w)) - (s_theta(y_l) - s_ref(y_l))],
    L = mean over pairs of -(1 - eps) log sigmoid(m) - eps log sigmoid(-m)."""
    assert inputs.ref_logprobs is not None, "dpo needs the reference policy's log-probs"
    seq = masked_sum(inputs.logprobs, inputs.mask, dim=-1)
    ref = masked_sum(inputs.ref_logprobs, inputs.mask, dim=-1)
    loss, stats = dpo_loss(seq[0::2], seq[1::2], ref[0::2], ref[1::2], beta, label_smoothing)
    return loss, {"dpo_loss": loss.detach(), **stats}
