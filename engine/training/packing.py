"""How a micro-batch's sequences are laid out for the model: padded rows, or one flat run.

Padded: each sequence in a row of its own, right-padded to the longest, one causal mask for all.
Packed: the micro-batch is one flat run of tokens, its sequences back to back with no padding.
Attention runs per segment (engine/training/segment_attention.py): a segment is one sequence
(causal, positions restarting at 0) or, with a shared prefix, the consecutive samples of one prompt
after one copy of it: each response attends to the prompt and to itself, and its positions
continue from the prompt's end, as in its own row of the padded layout. The first response token of
every sample is predicted by the prompt's last position, so gradients of all the samples flow into
one copy of the prompt and add up, as the padded path's do over copies. The linear layers, which
are most of the model, see the flat run: nothing is computed for padding. Attention is computed
segment by segment (dense inside one, so its cost grows with the square of a segment's length,
which is why a prompt's samples may be split over several segments: `_split_run`).

Both layouts give the model the same thing to compute per response token: the hidden state at
`out_positions[n]` of row `out_rows[n]` predicts the n-th response token of the micro-batch, in the
order of `response_slots` (sequence by sequence, only each response's own tokens: the output
layer computes no padding in either layout). Pure
functions of the token ids; the per-sequence tensors of the SeqBatch (masks, advantages, ...)
do not change with the layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate

import torch
import torch.nn.functional as F

from ..config.trainer import TrainerSpec
from ..models.arch import LlamaArch
from .sequences import SeqBatch, response_positions, response_slots


@dataclass(frozen=True)
class Segment:
    """A contiguous stretch [start, start + length) of a flat run that attends only within itself."""

    start: int
    length: int
    allowed: torch.Tensor | None
    """[length, length], True where a query (row) may attend to a key (column); None: causal."""

    def to(self, device: torch.device) -> "Segment":
        return Segment(self.start, self.length, None if self.allowed is None else self.allowed.to(device))


@dataclass(frozen=True)
class ModelInputs:
    input_ids: torch.Tensor
    """[rows, s] token ids (packed: one row)."""
    positions: torch.Tensor
    """[rows, s] RoPE position of each token."""
    attention_mask: torch.Tensor | None
    """Padded: [1, 1, s, s], True where attention is forbidden (Megatron's convention); packed: None."""
    out_positions: torch.Tensor
    """[N] the position, in its row, whose output predicts each response token (response_slots order)."""
    out_rows: torch.Tensor
    """[N] the row of that position."""
    segments: tuple[Segment, ...] | None = None
    """Packed: the flat run's attention segments, in order; positions after the last are padding
    (a pipeline's fixed length), which attends to nothing and which nothing attends to."""

    def to(self, device: torch.device) -> "ModelInputs":
        mask = None if self.attention_mask is None else self.attention_mask.to(device)
        segments = None if self.segments is None else tuple(s.to(device) for s in self.segments)
        return ModelInputs(
            self.input_ids.to(device), self.positions.to(device), mask, self.out_positions.to(device), self.out_rows.to(device), segments
        )

    @property
    def tokens(self) -> int:
        """Positions the model computes (the packed layout's padding to a fixed length included)."""
        return int(self.input_ids.numel())

    @property
    def attention_blocks(self) -> int:
        """Blocks of dense attention: padded rows, or packed segments."""
        return len(self.segments) if self.segments is not None else int(self.input_ids.shape[0])


def layout_options(trainer: TrainerSpec) -> dict[str, bool | int | None]:
    """MegatronLM's layout arguments from the job's trainer section (the same for every model of a job)."""
    return {"packed": trainer.sequence_packing, "share_prefix": trainer.shared_prefix, "micro_batch_tokens": trainer.micro_batch_tokens}


def padded_inputs(mb: SeqBatch) -> ModelInputs:
    b, s = mb.input_ids.shape
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    slots = response_slots(mb)
    out_positions = response_positions(mb)[slots]
    out_rows = torch.arange(b)[:, None].expand_as(slots)[slots]
    return ModelInputs(mb.input_ids, positions, causal, out_positions, out_rows)


def _prompt(mb: SeqBatch, row: int) -> list[int]:
    return mb.input_ids[row, : int(mb.prompt_lens[row])].tolist()


@dataclass(frozen=True)
class _Row:
    prompt: tuple[int, ...]
    response: int

    @property
    def read(self) -> int:
        """Response tokens the packed layout feeds the model: all but the last, which predicts
        nothing and which no other token of its segment attends to (its hidden state would be
        computed for nothing)."""
        return max(self.response - 1, 0)


def _rows(mb: SeqBatch) -> list[_Row]:
    return [_Row(tuple(_prompt(mb, r)), int(mb.response_lens[r])) for r in range(len(mb))]


def attention_span(arch: LlamaArch) -> float:
    """The segment length at which a segment's attention costs what its linear layers do: a segment
    of L tokens costs about L + L^2 / span tokens' worth. A layer's weights cost 2 FLOPs each per
    token; a pair of positions 4 x heads x head_dim FLOPs (scores and weighted sums), weighed 2
    times: torch's fused attention over a segment runs at about half the matmul rate, and on
    bench/train's long-answer batch segments of 2 samples (weight 2 or 1) took 7.6 s against 8.0 s
    for one sample each (weight 4) and 7.8 s for 4 (weight 0.5): bench/train/attention_weight.py."""
    d = arch.num_heads * arch.head_dim
    layer = arch.hidden_size * (2 * d + 2 * arch.num_kv_heads * arch.head_dim) + 3 * arch.hidden_size * arch.intermediate_size
    return 2 * layer / (2 * 4 * d)


def _row_cost(length: int, span: float | None) -> float:
    return length + (length * length / span if span else 0.0)


def _split_run(run: list[int], rows: list[_Row], span: float | None) -> list[list[int]]:
    """A run of samples with one prompt, as consecutive chunks of k samples that each share one
    copy of the prompt (a segment each); k the cheapest (the whole run where attention is cheap, one
    sample per segment where the answers are long enough that one segment's attention costs more
    than the copies of the prompt it saves). O(n log n) in the run's length n: a chunk's tokens
    come from running totals, and there are n / k chunks of k."""
    n = len(run)
    if span is None or n == 1:
        return [run]
    prompt = len(rows[run[0]].prompt)
    fed = list(accumulate((rows[r].read for r in run), initial=0))  # fed[i]: response tokens of run[:i]
    best_k, best_cost = n, float("inf")
    for k in range(n, 0, -1):  # the larger k on a tie: fewer segments
        cost = sum(_row_cost(prompt + fed[min(i + k, n)] - fed[i], span) for i in range(0, n, k))
        if cost < best_cost:
            best_k, best_cost = k, cost
    return [run[i : i + best_k] for i in range(0, n, best_k)]


def _segments_of(rows: list[_Row], share_prefix: bool, span: float | None = None) -> list[list[int]]:
    """Rows grouped into the packed layout's segments: runs of consecutive samples of one prompt,
    split where attention would cost more than sharing saves (each row alone without share_prefix)."""
    runs: list[list[int]] = []
    for i, row in enumerate(rows):
        if share_prefix and runs and rows[runs[-1][0]].prompt == row.prompt:
            runs[-1].append(i)
        else:
            runs.append([i])
    return [chunk for run in runs for chunk in _split_run(run, rows, span)]


def _lengths(rows: list[_Row], share_prefix: bool, span: float | None) -> list[int]:
    """Each segment's tokens in the packed layout: its prompt once, then its responses (each
    without its last token, _Row.read)."""
    return [len(rows[seg[0]].prompt) + sum(rows[r].read for r in seg) for seg in _segments_of(rows, share_prefix, span)]


def packed_inputs(mb: SeqBatch, share_prefix: bool, pad_id: int = 0, length: int | None = None, span: float | None = None) -> ModelInputs:
    """One flat run of the micro-batch's segments back to back (each sequence a segment of its own
    without share_prefix; with it, one copy of a prompt followed by its consecutive samples),
    padded to `length` when given (a pipeline needs every micro-batch in one shape). `span`
    (attention_span): split a run of samples where one segment's attention would cost more than
    the prompt's copies it saves."""
    rows = _rows(mb)
    ids: list[int] = []
    positions: list[int] = []
    segments: list[Segment] = []
    predicted_at: dict[int, list[int]] = {}  # per response row of mb: the flat positions predicting its tokens
    for run in _segments_of(rows, share_prefix, span):
        prompt = list(rows[run[0]].prompt)
        start = len(ids)
        ids += prompt
        positions += range(len(prompt))
        owner = [-1] * len(prompt)  # per token of the segment: the response's row in mb, -1 for the prompt
        for row in run:
            n, read = rows[row].response, rows[row].read
            first = len(ids)
            ids += mb.input_ids[row, len(prompt) : len(prompt) + read].tolist()
            positions += range(len(prompt), len(prompt) + read)
            owner += [row] * read
            # Token j is predicted by the position before it: the prompt's last for j = 0.
            predicted_at[row] = ([start + len(prompt) - 1] + list(range(first, first + read)))[:n]
        segments.append(Segment(start, len(ids) - start, _shared_prefix_mask(owner) if len(run) > 1 else None))
    # In response_slots order: row by row of mb, each row's tokens in order.
    out_positions = torch.tensor([p for row in range(len(rows)) for p in predicted_at[row]], dtype=torch.long)
    x = ModelInputs(
        torch.tensor(ids, dtype=torch.long)[None],
        torch.tensor(positions, dtype=torch.long)[None],
        None,
        out_positions,
        torch.zeros_like(out_positions),
        tuple(segments),
    )
    return x if length is None else pad_run(x, length, pad_id)


def positions_per_token(batches: list[SeqBatch], inputs: list[ModelInputs]) -> float:
    """Positions the model computes for `batches` laid out as `inputs`, per token of their sequences:
    above 1 where padding fills rows, below 1 where samples share one copy of their prompt (and a
    packed response's last token, which predicts nothing, is not fed)."""
    tokens = sum(int((mb.prompt_lens + mb.response_lens).sum()) for mb in batches)
    return sum(x.tokens for x in inputs) / max(tokens, 1)


def pad_run(x: ModelInputs, length: int, pad_id: int = 0) -> ModelInputs:
    """A packed micro-batch padded at the end of its run to `length` positions (a pipeline's one
    shape); the padding belongs to no segment, so it attends to nothing and nothing attends to it."""
    have = x.input_ids.shape[1]
    if have > length:
        raise ValueError(f"a packed micro-batch of {have} tokens does not fit the fixed length {length}")
    pad = length - have
    return replace(x, input_ids=F.pad(x.input_ids, (0, pad), value=pad_id), positions=F.pad(x.positions, (0, pad)))


def _shared_prefix_mask(owner: list[int]) -> torch.Tensor:
    """[L, L] allowed attention of one shared-prefix segment: a token sees the prompt's tokens
    before it and, in a response, its own response's."""
    who = torch.tensor(owner, dtype=torch.long)
    index = torch.arange(len(owner))
    causal = index[None, :] <= index[:, None]
    return causal & ((who[None, :] == -1) | (who[None, :] == who[:, None]))


def token_micro_batches(batch: SeqBatch, budget: int, share_prefix: bool, span: float | None = None) -> list[SeqBatch]:
    """Consecutive rows in micro-batches whose packed layout computes at most `budget` positions
    (the flat run's length: each segment's prompt once, then its responses); a row that alone
    exceeds the budget is a micro-batch of its own. Rows stay in order; the layout of each
    candidate is the one packed_inputs will build, so the count is what the model computes.

    Bounded: adding a row changes only the micro-batch's last run of samples (the rows with its
    prompt), so only that run is laid out again (_split_run, O(n log n) for n samples)."""
    rows = _rows(batch)

    def run_length(run: list[int]) -> int:
        return sum(_lengths([rows[r] for r in run], share_prefix, span))

    groups: list[list[int]] = []
    current: list[int] = []
    closed = 0  # positions of the runs of `current` before its last
    last: list[int] = []  # the last run of `current`: consecutive samples of one prompt
    last_length = 0  # its positions
    for i, row in enumerate(rows):
        if share_prefix and last and rows[last[0]].prompt == row.prompt:
            candidate_closed, candidate_last = closed, last + [i]
        else:
            candidate_closed, candidate_last = closed + last_length, [i]
        candidate_length = run_length(candidate_last)
        if current and candidate_closed + candidate_length > budget:
            groups.append(current)
            current, closed, last, last_length = [i], 0, [i], run_length([i])
        else:
            current, closed, last, last_length = current + [i], candidate_closed, candidate_last, candidate_length
    if current:
        groups.append(current)
    return [batch.select(g) for g in groups]


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
