"""Statistics of the policy's distribution at each response token beyond its log-probs.

The optimal token baseline weighs each token by the squared norm of its score function's gradient
with respect to the logits, 1 - 2 pi_t + sum_v pi_v^2; the last term needs the whole distribution,
which is split over the tensor-parallel ranks, so it is computed here, where the logits are.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .policy import MegatronLM
from .sequences import SeqBatch, on_response_grid


def vocab_parallel_sum_pi_squared(logits: torch.Tensor) -> torch.Tensor:
    """[N] sum over the vocabulary of the squared softmax probabilities, the vocabulary split across
    the TP group: sum_v exp(2 x_v) / (sum_v exp(x_v))^2, both sums reduced over TP."""
    from megatron.core import parallel_state as ps

    x = logits.float()
    top = x.max(-1, keepdim=True).values
    group = ps.get_tensor_model_parallel_group() if ps.get_tensor_model_parallel_world_size() > 1 else None
    if group is not None:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    e = torch.exp(x - top)
    sums = torch.stack([e.sum(-1), (e * e).sum(-1)])
    if group is not None:
        dist.all_reduce(sums, group=group)
    return sums[1] / sums[0] ** 2


def response_sum_pi_squared(model: MegatronLM, batches: list[SeqBatch]) -> list[torch.Tensor]:
    """Per micro-batch, [b, R] sum_v pi_v^2 at each response token (0 outside the mask)."""
    return model.response_outputs(batches, lambda logits, mb: on_response_grid(vocab_parallel_sum_pi_squared(logits), mb) * mb.mask)
