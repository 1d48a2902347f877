"""Batches of prompt+response token sequences, and how they are cut: pure functions, no model.

A sequence is a prompt followed by its response, right-padded to the batch's length L. Per-token
quantities of the response (log-probs, advantages, values) live in response-aligned tensors
[B, R]: column j is the response's j-th token, predicted at input position prompt_len + j - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable, Sequence

import torch


@dataclass
class SeqBatch:
    input_ids: torch.Tensor
    """[B, L] prompt + response, right-padded with pad_id."""
    prompt_lens: torch.Tensor
    """[B]"""
    response_lens: torch.Tensor
    """[B]"""
    mask: torch.Tensor
    """[B, R] 1.0 on the response tokens the loss counts: all of them, or a multi-turn trajectory's
    policy tokens (MaskedTokens)."""
    old_logprobs: torch.Tensor | None = None
    """The old policy's: vLLM's (rollout_logprobs) or recomputed by the trainer (algorithm.oldLogprobs)."""
    rollout_logprobs: torch.Tensor | None = None
    """vLLM's log-probs of the sampled tokens."""
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device) -> "SeqBatch":
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self) if getattr(self, f.name) is not None})

    def select(self, rows: Sequence[int] | slice) -> "SeqBatch":
        index = torch.arange(len(self))[rows] if isinstance(rows, slice) else torch.as_tensor(list(rows), dtype=torch.long)
        return replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self) if getattr(self, f.name) is not None})


class MaskedTokens(list):
    """A response's token ids with the loss mask of each (a multi-turn trajectory: 1 on the policy's
    own tokens, 0 on tool results and the chat template's tokens, which the policy saw but did not
    write). `pack` takes the mask from such a response; a plain list is the policy's throughout."""

    def __init__(self, ids: Sequence[int], mask: Sequence[int]):
        super().__init__(ids)
        if len(mask) != len(self):
            raise ValueError(f"a mask of {len(mask)} for {len(self)} tokens")
        self.mask = [int(m) for m in mask]


def pack(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    length: int | None = None,
    response_width: int | None = None,
) -> SeqBatch:
    """Pad prompt+response pairs into one batch (to `length` / `response_width` when given, so that
    every micro-batch of a pipeline has the same shape). The mask is 1 on each response's tokens, or
    a MaskedTokens response's own mask."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    L = length or max(lengths)
    R = response_width or max(1, max(len(r) for r in responses))
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), R)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, : len(p) + len(r)] = torch.tensor(list(p) + list(r), dtype=torch.long)
        own = getattr(r, "mask", None)
        mask[b, : len(r)] = 1.0 if own is None else torch.tensor(own, dtype=mask.dtype)
    return SeqBatch(ids, torch.tensor([len(p) for p in prompts]), torch.tensor([len(r) for r in responses]), mask)


def response_positions(batch: SeqBatch) -> torch.Tensor:
    """[B, R] input positions whose output predicts each response token (clamped inside the row)."""
    R = batch.mask.shape[1]
    L = batch.input_ids.shape[1]
    positions = batch.prompt_lens[:, None] - 1 + torch.arange(R)[None, :]
    return positions.clamp(0, L - 1)


def response_slots(batch: SeqBatch) -> torch.Tensor:
    """[B, R] True on each response's own tokens (j < response_len): the positions the output layer
    computes, in row-major order. The mask is at most these (an algorithm may mask more out)."""
    return torch.arange(batch.mask.shape[1], device=batch.response_lens.device)[None, :] < batch.response_lens[:, None]


def on_response_grid(flat: torch.Tensor, batch: SeqBatch) -> torch.Tensor:
    """[N] per-token values in response_slots order as the [B, R] grid (0 elsewhere); differentiable."""
    slots = response_slots(batch)
    return flat.new_zeros(slots.shape).masked_scatter(slots, flat)


def response_tokens(batch: SeqBatch) -> torch.Tensor:
    """[B, R] the response's token ids (0 outside the mask): the labels of the response positions."""
    L = batch.input_ids.shape[1]
    index = (response_positions(batch) + 1).clamp(max=L - 1)
    return batch.input_ids.gather(1, index) * batch.mask.long()


def micro_batches(batch: SeqBatch, size: int) -> list[SeqBatch]:
    return [batch.select(slice(start, start + size)) for start in range(0, len(batch), size)]


def pad_rows(batch: SeqBatch, rows: int) -> SeqBatch:
    """`batch` grown to `rows` rows by copies of its first row with an empty mask (they weigh nothing);
    a pipeline needs every micro-batch in the same shape."""
    extra = rows - len(batch)
    if extra <= 0:
        return batch
    padded = batch.select([*range(len(batch)), *([0] * extra)])
    padded.mask[len(batch) :] = 0
    return padded


def shard_rows(n: int, rank: int, world: int) -> range:
    """The contiguous rows [start, stop) of n that rank `rank` of `world` takes (sizes differ by at most one)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer update: rows [start, end) of a step's batch, at learning rate `lr`."""

    start: int
    end: int
    lr: float


def update_plan(rows: int, mini_batch_size: int | None, epochs: int, lr_of_update: Callable[[int], float]) -> list[MiniBatch]:
    """Every update of one step, in order: `epochs` passes over `rows` in mini-batches (the whole
    batch when no size is set); `lr_of_update(i)` is the rate of the step's i-th update."""
    size = mini_batch_size or rows
    starts = [start for _ in range(epochs) for start in range(0, rows, size)]
    return [MiniBatch(start, min(start + size, rows), lr_of_update(i)) for i, start in enumerate(starts)]
