"""The micro-batch layouts as pure functions: flat packed runs, shared prompts, token budgets, DP shards by tokens."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberl.engine.training.packing import (
    packed_inputs,
    padded_inputs,
    positions_per_token,
    shard_by_tokens,
    token_micro_batches,
)
from kuberl.engine.training.sequences import on_response_grid, pack, response_slots


def _batch():
    # Prompt [1, 2, 3] twice (two samples), then prompt [4, 5] once.
    return pack([[1, 2, 3], [1, 2, 3], [4, 5]], [[7, 8], [9, 10], [6, 6, 6]], pad_id=0)


def test_shared_prefix_puts_one_copy_of_the_prompt_before_its_samples():
    x = packed_inputs(_batch(), share_prefix=True)
    # One flat run: [prompt 1 2 3, sample 1, sample 2], then [prompt 4 5, its sample]; a response's
    # last token predicts nothing and is left out (7 8 -> 7, 9 10 -> 9, 6 6 6 -> 6 6).
    assert x.input_ids.tolist() == [[1, 2, 3, 7, 9, 4, 5, 6, 6]]
    # Each sample's positions continue from the prompt's end, as in its own padded row.
    assert x.positions.tolist() == [[0, 1, 2, 3, 3, 0, 1, 2, 3]]
    assert [(s.start, s.length) for s in x.segments] == [(0, 5), (5, 4)] and x.attention_mask is None
    allowed = x.segments[0].allowed.int()
    assert allowed[4].tolist() == [1, 1, 1, 0, 1]  # sample 2 sees the prompt and itself, not sample 1
    assert allowed[3].tolist() == [1, 1, 1, 1, 0]
    assert x.segments[1].allowed is None  # one sample: plain causal attention
    # Sample b's token j is predicted at the prompt's last position (j = 0), then at its own tokens;
    # one entry per response token (2, 2 and 3 of them).
    assert x.out_positions.tolist() == [2, 3, 2, 4, 6, 7, 8]
    assert x.out_rows.tolist() == [0] * 7
    assert packed_inputs(_batch(), False).tokens == 12
    assert x.tokens == 9 and x.attention_blocks == 2


def test_positions_per_token_shows_what_padding_costs_and_sharing_saves():
    batch = _batch()  # 15 tokens in its three sequences
    padded = positions_per_token([batch], [padded_inputs(batch)])
    assert padded == padded_inputs(batch).input_ids.numel() / 15 >= 1
    assert positions_per_token([batch], [packed_inputs(batch, share_prefix=False)]) == 12 / 15
    assert positions_per_token([batch], [packed_inputs(batch, share_prefix=True)]) == 9 / 15
    assert positions_per_token([], []) == 0


def test_without_sharing_every_sequence_is_a_segment_of_its_own():
    x = packed_inputs(_batch(), share_prefix=False)
    assert x.input_ids.tolist() == [[1, 2, 3, 7, 1, 2, 3, 9, 4, 5, 6, 6]]
    assert x.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]]
    assert [(s.start, s.length, s.allowed) for s in x.segments] == [(0, 4, None), (4, 4, None), (8, 4, None)]
    assert x.out_positions.tolist() == [2, 3, 6, 7, 9, 10, 11]


def test_a_fixed_length_pads_the_run_after_its_last_segment():
    x = packed_inputs(_batch(), share_prefix=True, length=12)
    assert x.input_ids.shape == (1, 12) and x.tokens == 12
    assert x.input_ids[0, 9:].tolist() == [0, 0, 0] and sum(s.length for s in x.segments) == 9
    with pytest.raises(ValueError, match="does not fit the fixed length 6"):
        packed_inputs(_batch(), share_prefix=True, length=6)


def test_padded_layout_is_one_row_per_sequence():
    x = padded_inputs(_batch())
    assert x.input_ids.shape == (3, 5) and x.tokens == 15
    assert x.out_rows.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert x.out_positions.tolist() == [2, 3, 2, 3, 1, 2, 3]


def test_flat_outputs_go_back_to_their_response_columns():
    batch = _batch()
    grid = on_response_grid(torch.arange(1.0, 8.0), batch)
    assert grid.tolist() == [[1, 2, 0], [3, 4, 0], [5, 6, 7]]
    assert response_slots(batch).sum() == 7


def test_token_budget_fills_micro_batches_in_order():
    batch = _batch()
    assert [len(mb) for mb in token_micro_batches(batch, budget=7, share_prefix=True)] == [2, 1]  # 3+1+1, then 2+2
    assert [len(mb) for mb in token_micro_batches(batch, budget=7, share_prefix=False)] == [1, 1, 1]
    assert [len(mb) for mb in token_micro_batches(batch, budget=2, share_prefix=True)] == [1, 1, 1]  # too long: alone


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(1, 6), st.lists(st.integers(1, 5), min_size=1, max_size=4)), min_size=1, max_size=6),
    budget=st.integers(1, 30),
    share=st.booleans(),
    span=st.sampled_from([None, 2.0, 40.0]),
)
def test_token_budget_is_greedy_over_computed_positions(groups, budget, share, span):
    # Prompts of distinct tokens (prompt k is k repeated), each with its samples' response lengths.
    prompts = [[k + 1] * length for k, (length, samples) in enumerate(groups) for _ in samples]
    responses = [[99] * r for _, samples in groups for r in samples]
    batch = pack(prompts, responses, pad_id=0)
    mbs = token_micro_batches(batch, budget, share_prefix=share, span=span)
    assert sum(len(mb) for mb in mbs) == len(batch)

    def computed(mb) -> int:  # what the model computes: the flat run, as packed_inputs lays it out
        return packed_inputs(mb, share, span=span).tokens

    start = 0
    for mb in mbs:
        assert len(mb) == 1 or computed(mb) <= budget
        end = start + len(mb)
        if end < len(batch):  # the next row did not fit: the micro-batch is as full as greedy makes it
            assert computed(batch.select(list(range(start, end + 1)))) > budget
        start = end


def test_a_run_is_shared_whole_when_attention_is_cheap_and_split_when_answers_are_long():
    from kuberl.engine.training.packing import _Row, _split_run

    short = [_Row((1,) * 40, 10) for _ in range(8)]  # the main job's shape: a long prompt, short answers
    assert _split_run(list(range(8)), short, span=768.0) == [list(range(8))]
    long = [_Row((1,) * 16, 96) for _ in range(8)]  # long answers, costly attention: one sample a segment
    assert _split_run(list(range(8)), long, span=768.0) == [[r] for r in range(8)]
    # SmolLM2's span (1536, below): bench/train's long-answer batch in segments of two samples.
    assert _split_run(list(range(8)), long, span=1536.0) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    middle = [_Row((1,) * 16, 40) for _ in range(8)]  # in between: rows of a few samples
    chunks = _split_run(list(range(8)), middle, span=768.0)
    assert 1 < len(chunks) < 8 and sum(chunks, []) == list(range(8))
    assert _split_run(list(range(8)), long, span=None) == [list(range(8))]


def test_attention_span_of_smollm2_balances_a_layer_against_its_attention():
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.training.packing import attention_span

    arch = LlamaArch(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        qkv_bias=False,
    )
    # A layer: 576 x (2 x 576 + 2 x 192) + 3 x 576 x 1536 weights; a pair of positions: 4 x 576 FLOPs, weighed 2 times.
    assert attention_span(arch) == 2 * (576 * (2 * 576 + 2 * 192) + 3 * 576 * 1536) / (8 * 576) == 1536


@pytest.mark.parametrize(
    "tokens,world,expected",
    [
        ([10, 10, 10, 10], 2, [[0, 1], [2, 3]]),
        ([100, 1, 1, 1, 1, 1], 2, [[0], [1, 2, 3, 4, 5]]),  # by tokens, not rows
        ([1, 1, 1, 100], 2, [[0, 1, 2], [3]]),
        ([3, 3], 4, [[0], [1], [], []]),
    ],
)
def test_dp_shards_balance_tokens_and_cover_every_row(tokens, world, expected):
    assert [list(shard_by_tokens(tokens, r, world)) for r in range(world)] == expected


def test_shards_are_a_partition_on_random_batches():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, world = int(torch.randint(1, 20, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        tokens = torch.randint(1, 50, (n,), generator=g).tolist()
        rows = [i for r in range(world) for i in shard_by_tokens(tokens, r, world)]
        assert rows == list(range(n))
