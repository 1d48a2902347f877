"""Preference losses: DPO over pairs of sequence log-probs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
             ref_rejected_logps: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
