"""How a micro-batch's sequences are laid out for the model: padded rows, or one packed row.

Padded: each sequence in a row of its own, right-padded to the longest, one causal mask for all.
Packed: the sequences back to back in one row, each attending only to itself (a block-diagonal
causal mask), RoPE positions restarting at every sequence, so no padding is computed. With a
shared prefix, consecutive sequences with the same prompt (the samples of one prompt) share one
copy of it: the prompt's tokens appear once, each response attends to the prompt and to itself,
and its positions continue from the prompt's end, as in its own row of the padded layout. The
first response token of every sample is predicted by the prompt's last position, so gradients of
all the samples flow into one copy of the prompt and add up, as the padded path's do over copies.

Both layouts give the model the same thing to compute per response token: the hidden state at
`out_positions[b, j]` of row `out_rows[b, j]` predicts response token j of sequence b. Pure
functions of the token ids; the per-sequence tensors of the SeqBatch (masks, advantages, ...)
do not change with the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config.trainer import TrainerSpec
from .sequences import SeqBatch, response_positions


@dataclass(frozen=True)
class ModelInputs:
    input_ids: torch.Tensor
    """[rows, s] token ids."""
    positions: torch.Tensor
    """[rows, s] RoPE position of each token."""
    attention_mask: torch.Tensor
    """[rows or 1, 1, s, s], True where attention is forbidden (Megatron's convention)."""
    out_positions: torch.Tensor
    """[B, R] the position, in its row, whose output predicts each response token."""
    out_rows: torch.Tensor
    """[B, R] the row of that position."""

    @property
    def tokens(self) -> int:
        """Positions the model computes (the packed layout's padding to a fixed length included)."""
        return int(self.input_ids.numel())


def layout_options(trainer: TrainerSpec) -> dict[str, bool | int | None]:
    """MegatronLM's layout arguments from the job's trainer section (the same for every model of a job)."""
    return {"packed": trainer.sequence_packing, "share_prefix": trainer.shared_prefix,
            "micro_batch_tokens": trainer.micro_batch_tokens}


def padded_inputs(mb: SeqBatch) -> ModelInputs:
    b, s = mb.input_ids.shape
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    out_positions = response_positions(mb)
    out_rows = torch.arange(b)[:, None].expand_as(out_positions)
    return ModelInputs(mb.input_ids, positions, causal, out_positions, out_rows)


def _prompt(mb: SeqBatch, row: int) -> list[int]:
    return mb.input_ids[row, :int(mb.prompt_lens[row])].tolist()


def _segments(mb: SeqBatch, share_prefix: bool) -> list[list[int]]:
    """Rows grouped into runs that share a prompt (each row alone without share_prefix)."""
    runs: list[list[int]] = []
    for row in range(len(mb)):
        if share_prefix and runs and _prompt(mb, runs[-1][0]) == _prompt(mb, row):
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def packed_length(mb: SeqBatch, share_prefix: bool) -> int:
    """Tokens of the packed layout, before any padding to a fixed length."""
    return sum(int(mb.prompt_lens[run[0]]) + sum(int(mb.response_lens[r]) for r in run) for run in _segments(mb, share_prefix))


def packed_inputs(mb: SeqBatch, share_prefix: bool, pad_id: int = 0, length: int | None = None) -> ModelInputs:
    """One row of every sequence of `mb` back to back (padded to `length` when given: a pipeline
    needs every micro-batch in one shape)."""
    B, R = mb.mask.shape
    ids: list[int] = []
    positions: list[int] = []
    segment_of: list[int] = []  # which run each token belongs to
    response_of: list[int] = []  # the row of the response a token is in; -1 for a prompt token
    out_positions = torch.zeros(B, R, dtype=torch.long)
    for run_index, run in enumerate(_segments(mb, share_prefix)):
        prompt = _prompt(mb, run[0])
        start = len(ids)
        ids += prompt
        positions += range(len(prompt))
        segment_of += [run_index] * len(prompt)
        response_of += [-1] * len(prompt)
        last_prompt = start + len(prompt) - 1
        for row in run:
            n = int(mb.response_lens[row])
            first = len(ids)
            ids += mb.input_ids[row, len(prompt):len(prompt) + n].tolist()
            positions += range(len(prompt), len(prompt) + n)
            segment_of += [run_index] * n
            response_of += [row] * n
            # Token j is predicted by the position before it: the prompt's last for j = 0.
            predicting = [last_prompt] + list(range(first, first + n - 1))
            out_positions[row, :n] = torch.tensor(predicting[:n], dtype=torch.long) if n else out_positions[row, :0]
    total = len(ids)
    s = max(total, length or 0)
    if length is not None and total > length:
        raise ValueError(f"a packed micro-batch of {total} tokens does not fit the fixed length {length}")
    pad = s - total
    ids += [pad_id] * pad
    positions += [0] * pad
    segment = torch.tensor(segment_of + list(range(-1, -1 - pad, -1)), dtype=torch.long)  # each pad token alone
    response = torch.tensor(response_of + [-2] * pad, dtype=torch.long)
    index = torch.arange(s)
    causal = index[None, :] <= index[:, None]
    same_segment = segment[:, None] == segment[None, :]
    # Within a run: every token sees the prompt's tokens before it; a response token also sees its own response's.
    visible = (response[None, :] == -1) | (response[None, :] == response[:, None])
    allowed = causal & same_segment & visible
    return ModelInputs(torch.tensor([ids], dtype=torch.long), torch.tensor([positions], dtype=torch.long),
                       ~allowed[None, None], out_positions, torch.zeros(B, R, dtype=torch.long))


def token_micro_batches(batch: SeqBatch, budget: int, share_prefix: bool) -> list[SeqBatch]:
    """Consecutive rows in micro-batches of at most `budget` packed tokens (a row longer than the
    budget alone); rows stay in order, so the samples of one prompt stay together where they fit."""
    groups: list[list[int]] = []
    for row in range(len(batch)):
        if groups and packed_length(batch.select(groups[-1] + [row]), share_prefix) <= budget:
            groups[-1].append(row)
        else:
            groups.append([row])
    return [batch.select(rows) for rows in groups]


def shard_by_tokens(tokens: list[int], rank: int, world: int) -> range:
    """The contiguous rows of `tokens` (each row's token count) that DP rank `rank` of `world` takes:
    cut where the running total first reaches each k/world of the whole, so that the ranks' token
    counts, not their row counts, are even; every rank keeps at least one row while rows last."""
    n = len(tokens)
    if n <= world:
        return range(min(rank, n), min(rank + 1, n))
    total, running, cuts = sum(tokens), 0, [0]
    for row, count in enumerate(tokens[:-1]):
        running += count
        if len(cuts) < world and running * world >= total * len(cuts) and n - (row + 1) >= world - len(cuts):
            cuts.append(row + 1)
    while len(cuts) < world:  # the tail is heavy: the last ranks take one row each
        cuts.append(n - (world - len(cuts)))
    cuts.append(n)
    return range(cuts[rank], cuts[rank + 1])
