"""Layers of a megatron-core GPT model that read the layout of the micro-batch being computed.

megatron-core's forward takes token ids, positions and a mask; a packed micro-batch
(training/packing.py) needs more than that: the rotary embedding must follow each token's own
position (positions restart per sequence, or continue from a shared prompt), and the output layer
computes only the positions that predict a response token. Each function here wraps one module's
forward, in place, so that it reads what it needs from `current()`: the `ModelInputs` of the
micro-batch the schedule is computing. Modules keep their names and weights (checkpoints and the
hybrid engine see the same state). Attention per segment lives in segment_attention.py.
"""

from __future__ import annotations

from typing import Callable

import torch

from .packing import ModelInputs

CurrentInputs = Callable[[], ModelInputs]


def only_response_positions(layer: torch.nn.Module, current: CurrentInputs, logit_temperature: float = 1.0) -> None:
    """Make the output layer (LM head or value head) compute only the response positions.

    Log-probs and values are needed there and nowhere else; the prompt's positions through a
    49k-word head are a large share of a small model's FLOPs.
    """
    original = layer.forward

    def forward(hidden_states: torch.Tensor, *args, **kwargs):
        # hidden states [s, rows, h] -> the N that predict a response token, as one row [N, 1, h]
        x = current()
        selected = hidden_states[x.out_positions, x.out_rows][:, None]
        if logit_temperature != 1.0:
            # logits / T, computed as (h / T) W: the head has no bias, and [N, h] is a
            # hundredth of [N, v] to divide (and to back-propagate through).
            selected = selected / logit_temperature
        return original(selected, *args, **kwargs)

    layer.forward = forward


def rope_at_positions(rotary: torch.nn.Module, current: CurrentInputs) -> None:
    """Make the rotary embedding follow each token's own position, not its index in the row.

    megatron-core's local attention path rotates token i by position i of the row; a packed row
    holds several sequences whose positions restart (or, with a shared prefix, continue from the
    prompt), so the angles are looked up per token: [s, rows, 1, d] instead of [s, 1, 1, d].
    megatron-core's YarnRotaryEmbedding returns (table, mscale): the table is looked up the same, the scale kept.
    """
    original = rotary.forward

    def forward(max_seq_len: int, *args, **kwargs):
        positions = current().positions  # [rows, s]
        out = original(max(max_seq_len, int(positions.max()) + 1), *args, **kwargs)  # [n, 1, 1, d]
        table, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        looked_up = table[:, 0, 0, :][positions.T][:, :, None, :]
        return looked_up if rest is None else (looked_up, *rest)

    rotary.forward = forward
