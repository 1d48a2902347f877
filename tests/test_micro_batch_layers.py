"""The wrapped layers of engine/training/micro_batch_layers.py against what they stand for: megatron-core's
rotary table looked up at each token's own position, and the output layer at the response positions only."""

from __future__ import annotations

import pytest
import torch

from kuberl.engine.training.packing import packed_inputs, padded_inputs
from kuberl.engine.training.sequences import pack
from kuberl.engine.training.micro_batch_layers import only_response_positions, rope_at_positions

BATCH = pack([[1, 2, 3, 4]] * 2 + [[5, 6]], [[7, 8, 9], [10, 11, 12, 13], [14, 15]], pad_id=0)


class AngleTable(torch.nn.Module):
    """Stands in for megatron-core's RotaryEmbedding, whose forward wants CUDA unless the process-wide
    engine/compat redirections are installed (not in this test process): the same contract,
    forward(max_seq_len) -> [max_seq_len, 1, 1, d] angles. The real one is wrapped in every model of
    tests/rl/test_packing.py, whose packed log-probs equal the padded path's."""

    def __init__(self, dim: int):
        super().__init__()
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))

    def forward(self, max_seq_len: int) -> torch.Tensor:
        angles = torch.outer(torch.arange(max_seq_len).float(), self.inv_freq)
        return torch.cat([angles, angles], -1)[:, None, None, :]


def test_rotary_angles_follow_each_tokens_position_not_its_index_in_the_run():
    x = packed_inputs(BATCH, share_prefix=True)
    rotary = AngleTable(8)
    table = rotary(64)  # [64, 1, 1, 8]: the angles of positions 0..63
    rope_at_positions(rotary, lambda: x)
    got = rotary(x.input_ids.shape[1])  # [s, rows, 1, 8]
    assert got.shape == (x.input_ids.shape[1], 1, 1, 8)
    for i, position in enumerate(x.positions[0].tolist()):
        assert torch.equal(got[i, 0, 0], table[position, 0, 0])
    # A packed run's positions restart or continue from a prompt: the index in the run is not the position.
    assert x.positions[0].tolist() != list(range(x.input_ids.shape[1]))


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_output_layer_sees_only_the_positions_that_predict_a_response_token(layout):
    x = padded_inputs(BATCH) if layout == "padded" else packed_inputs(BATCH, share_prefix=True)
    rows, length = x.input_ids.shape
    head = torch.nn.Linear(6, 5, bias=False)
    hidden = torch.randn(length, rows, 6, generator=torch.Generator().manual_seed(0))  # Megatron's [s, b, h]
    want = head(hidden[x.out_positions, x.out_rows] / 2.0)
    only_response_positions(head, lambda: x, logit_temperature=2.0)
    got = head(hidden)
    assert got.shape == (int(BATCH.response_lens.sum()), 1, 5)
    assert torch.allclose(got[:, 0], want)


class ScaledAngleTable(AngleTable):
    """megatron-core's YarnRotaryEmbedding's contract: forward(max_seq_len) -> (angles, the cos/sin scale)."""

    def forward(self, max_seq_len: int) -> tuple[torch.Tensor, float]:  # type: ignore[override]
        return super().forward(max_seq_len), 1.25


def test_a_rotary_table_that_comes_with_its_scale_is_looked_up_and_keeps_the_scale():
    x = packed_inputs(BATCH, share_prefix=True)
    rotary = ScaledAngleTable(8)
    table, _ = rotary(64)
    rope_at_positions(rotary, lambda: x)
    got, scale = rotary(x.input_ids.shape[1])
    assert scale == 1.25 and got.shape == (x.input_ids.shape[1], 1, 1, 8)
    assert torch.equal(got[:, 0, 0], table[x.positions[0], 0, 0])
