"""Segment attention (engine/training/segment_attention.py) against dense attention over the whole
flat run with the block-diagonal mask the segments stand for: same context, same gradients."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl.engine.training.packing import Segment, packed_inputs
from kuberl.engine.training.sequences import pack
from kuberl.engine.training.segment_attention import segment_attention


def _dense_allowed(segments: tuple[Segment, ...], length: int) -> torch.Tensor:
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for s in segments:
        block = s.allowed if s.allowed is not None else torch.ones(s.length, s.length, dtype=torch.bool).tril()
        allowed[s.start : s.start + s.length, s.start : s.start + s.length] = block
    return allowed


def _dense(q, k, v, allowed, heads, groups):
    """Megatron's local attention, written out: groups repeated to heads, masked scores, softmax."""
    q, k, v = (x[:, 0].transpose(0, 1) for x in (q, k, v))
    k, v = k.repeat_interleave(heads // groups, 0), v.repeat_interleave(heads // groups, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
    probs = scores.masked_fill(~allowed, -10000.0).softmax(-1)
    return (probs @ v).transpose(0, 1).reshape(q.shape[1], 1, -1)


def test_segments_compute_the_block_diagonal_attention_and_its_gradients():
    # Prompt A with two samples (one shared segment), prompt B alone; 8 positions of a pipeline's padding.
    batch = pack([[1, 2, 3, 4]] * 2 + [[5, 6]], [[7, 8, 9], [10, 11, 12, 13], [14, 15]], pad_id=0)
    x = packed_inputs(batch, share_prefix=True, length=20)
    used = sum(s.length for s in x.segments)
    heads, groups, dim = 4, 2, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(20, 1, n, dim, generator=g, requires_grad=True) for n in (heads, groups, groups))
    got = segment_attention(q, k, v, x.segments, 1 / math.sqrt(dim))
    allowed = _dense_allowed(x.segments, used)
    want = _dense(q[:used], k[:used], v[:used], allowed, heads, groups)
    assert got.shape == (20, 1, heads * dim)
    assert torch.allclose(got[:used], want, atol=1e-6)
    assert torch.equal(got[used:], torch.zeros(20 - used, 1, heads * dim))  # padding: nothing attended
    weights = torch.randn(used, 1, heads * dim, generator=g)
    grads = torch.autograd.grad((got[:used] * weights).sum(), (q, k, v))
    wants = torch.autograd.grad((want * weights).sum(), (q, k, v))
    for a, b in zip(grads, wants):
        assert torch.allclose(a, b, atol=1e-5)
    # The shared segment's mask matters: a sample attending to the other sample would differ.
    causal_only = tuple(Segment(s.start, s.length, None) for s in x.segments)
    assert not torch.allclose(segment_attention(q, k, v, causal_only, 1 / math.sqrt(dim))[:used], want, atol=1e-3)


def test_segments_must_tile_the_run_from_its_start():
    q = torch.zeros(6, 1, 2, 4)
    with pytest.raises(ValueError, match="starts at 2, expected 0"):
        segment_attention(q, q, q, (Segment(2, 3, None),), 0.5)
    with pytest.raises(ValueError, match="cover 8 positions of a run of 6"):
        segment_attention(q, q, q, (Segment(0, 8, None),), 0.5)
    with pytest.raises(ValueError, match="one flat row"):
        segment_attention(torch.zeros(6, 2, 2, 4), q, q, (Segment(0, 6, None),), 0.5)
