"""Attention over a flat run of packed sequences, one segment at a time.

megatron-core's packed-sequence path (THD, `PackedSeqParams`) needs Transformer Engine's attention,
which does not run on a CPU, and its local attention is dense over a whole row. A packed micro-batch
(training/packing.py) is one flat run of segments, each a sequence or a prompt with its samples;
here each segment's queries attend to its own keys only, through torch's scaled-dot-product
attention (its fused CPU kernel, grouped-query heads without copying the keys), with the
segment's own mask or plain causal attention. The linear layers around it see the flat run, so
nothing anywhere is computed for padding. Exact: the same softmax over the same allowed pairs
as the padded path's masked attention, to float rounding (tests/rl/test_packing.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .packing import Segment


def segment_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: Sequence[Segment], scale: float
) -> torch.Tensor:
    """query [T, 1, heads, d], key and value [T, 1, groups, d] (Megatron's [s, b, n, d], one row)
    -> context [T, 1, heads x d]. Positions after the last segment (a pipeline's padding) get a
    zero context."""
    length, rows, heads, dim = query.shape
    if rows != 1:
        raise ValueError(f"segment attention takes one flat row, got {rows}")
    end = 0
    for segment in segments:
        if segment.start != end:
            raise ValueError(f"segments must tile the run from 0: one starts at {segment.start}, expected {end}")
        end = segment.start + segment.length
    if end > length:
        raise ValueError(f"segments cover {end} positions of a run of {length}")
    q, k, v = (x[:, 0].transpose(0, 1) for x in (query, key, value))  # [n, T, d]
    parts = [
        F.scaled_dot_product_attention(
            q[None, :, s.start : s.start + s.length],
            k[None, :, s.start : s.start + s.length],
            v[None, :, s.start : s.start + s.length],
            attn_mask=s.allowed,
            is_causal=s.allowed is None,
            scale=scale,
            enable_gqa=True,
        )[0]
        for s in segments
    ]
    if end < length:
        parts.append(q.new_zeros(heads, length - end, dim))
    return torch.cat(parts, dim=1).transpose(0, 1).reshape(length, 1, heads * dim)


def use_segments(core_attention: torch.nn.Module, segments_of: Callable[[], Sequence[Segment] | None]) -> None:
    """Make one layer's core attention (megatron's DotProductAttention) attend per segment whenever
    `segments_of()` gives the segments of the micro-batch being computed; Megatron's own path
    (and its mask) otherwise. The module keeps its name and state."""
    original = core_attention.forward
    scale = core_attention.softmax_scale

    def forward(query, key, value, attention_mask, *args, **kwargs):
        segments = segments_of()
        if segments is None:
            return original(query, key, value, attention_mask, *args, **kwargs)
        return segment_attention(query, key, value, segments, scale)

    core_attention.forward = forward
