"""LoRA on a megatron-core GPTModel: adapters beside the frozen linear layers of one rank's stage.

Each targeted layer keeps its weights and names (the base streams, loads and converts as before)
and gains a child `lora_<target>` holding this rank's A and B (models/lora_layout.py: column-parallel
layers keep A whole and split B, row-parallel ones split A and keep B whole). Its forward, wrapped
in place, adds scale * B A x:

- column-parallel (linear_qkv, linear_fc1): z = A x is the same on every TP rank, and passes through
  megatron's copy-to-TP region, so that the backward sums dz over the ranks' B shards: A's gradient
  (and the input's, through A) is then whole and equal on every rank. B's rows go where the
  layer's own rows are: q, k, v interleaved per query group, gate then up.
- row-parallel (linear_proj, linear_fc2): each rank's A times its slice of x is a partial sum,
  reduced over TP (forward all-reduce, backward identity) before the whole B.

Split tensors carry megatron's tensor-parallel attributes, so the gradient norm counts them once
per rank and the replicated ones once per TP group. The base is frozen (requires_grad off): DDP
and the distributed optimizer see the adapters alone. `off()` computes the base model: the
reference policy of a LoRA run (`AdapterOff`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.nn.functional as F

from ..config.lora import LoRASpec
from ..models.arch import LlamaArch
from ..models.convert import stage_layers
from ..models.lora_layout import MEGATRON_MODULE, init_pair, megatron_name, shard_pair, split_kind


class LoRABranch(torch.nn.Module):
    """One projection's adapter as this TP rank holds it."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, column: bool):
        super().__init__()
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        self.A = torch.nn.Parameter(a)
        self.B = torch.nn.Parameter(b)
        self.column = column
        # The split one: B by rows in a column-parallel layer, A by columns in a row-parallel one.
        split, dim = (self.B, 0) if column else (self.A, 1)
        set_tensor_model_parallel_attributes(split, True, dim, 1)

    def down(self, x: torch.Tensor) -> torch.Tensor:
        """z = A x, whole on every TP rank."""
        from megatron.core.tensor_parallel.mappings import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        z = F.linear(x, self.A)
        return copy_to_tensor_model_parallel_region(z) if self.column else reduce_from_tensor_model_parallel_region(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.down(x), self.B)


class Adapters:
    """The adapters of one model (one rank's stage): on or off, their state, and their dropout's
    generator: seeded alike on the ranks of a TP group (a column-parallel layer's A sees the same
    input there, so it must see the same mask) and saved with the checkpoint (exact resume)."""

    def __init__(self, spec: LoRASpec, seed: int = 0, device: torch.device | str = "cpu"):
        self.spec, self.scale = spec, spec.scale()
        self.enabled = True
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.branches: dict[str, LoRABranch] = {}
        """By stage-local Megatron name prefix (`decoder.layers.0.self_attention.linear_qkv.lora_q`)."""

    @contextmanager
    def off(self) -> Iterator[None]:
        """The base model for the duration (the reference policy)."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    def state(self) -> dict[str, torch.Tensor]:
        """This rank's A and B tensors by stage-local Megatron name."""
        return {f"{prefix}.{which}": getattr(branch, which).detach() for prefix, branch in self.branches.items() for which in ("A", "B")}

    @torch.no_grad()
    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        mine = self.state()
        if set(state) != set(mine):
            missing, unexpected = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
            raise RuntimeError(f"adapter does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
        for prefix, branch in self.branches.items():
            branch.A.copy_(state[prefix + ".A"])
            branch.B.copy_(state[prefix + ".B"])

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        keep = 1.0 - self.spec.dropout
        mask = torch.rand(x.shape, generator=self.generator, device=x.device, dtype=torch.float32) < keep
        return x * mask.to(x.dtype) / keep

    def numel(self) -> int:
        return sum(b.A.numel() + b.B.numel() for b in self.branches.values())


def is_adapter_name(name: str) -> bool:
    return ".lora_" in name


def attach(
    module: torch.nn.Module, arch: LlamaArch, spec: LoRASpec, *, tp: int, tp_rank: int, pp: int, pp_rank: int, dp_rank: int, seed: int
) -> Adapters:
    """Freeze `module` (its base weights already loaded) and give its targeted layers adapters,
    initialised as models/lora_layout.init_pair draws them; returns them."""
    module.requires_grad_(False)
    device = next(module.parameters()).device
    adapters = Adapters(spec, seed=seed * 1_000_003 + 7919 * (dp_rank * pp + pp_rank) + 1, device=device)
    dtype = module.config.params_dtype
    for local, (layer, block) in enumerate(zip(stage_layers(arch, pp_rank, pp), module.decoder.layers)):
        by_layer: dict[str, dict[str, LoRABranch]] = {}
        for target in spec.target_modules:
            a, b = shard_pair(*init_pair(arch, target, spec.rank, layer, seed, dtype), target, tp_rank, tp)
            branch = LoRABranch(a.to(device), b.to(device), split_kind(target) == "column")
            path = MEGATRON_MODULE[target][0]
            by_layer.setdefault(path, {})[target] = branch
            adapters.branches[megatron_name(local, target, "A")[:-2]] = branch
        for path, branches in by_layer.items():
            linear = block.get_submodule(path)
            for target, branch in branches.items():
                linear.add_module(f"lora_{target}", branch)
            _wrap(linear, path, branches, adapters, arch, tp)
    return adapters


def _wrap(linear: torch.nn.Module, path: str, branches: dict[str, LoRABranch], adapters: Adapters, arch: LlamaArch, tp: int) -> None:
    """Make `linear` add its adapters' output to its own (while they are on)."""
    original = linear.forward
    combine = _COMBINE[path]
    p = adapters.spec.dropout

    def forward(input_: torch.Tensor, *args: Any, **kwargs: Any):
        output, bias = original(input_, *args, **kwargs)
        if not adapters.enabled:
            return output, bias
        x = adapters.dropout(input_) if p > 0 and linear.training else input_
        parts = {target: branch(x) for target, branch in branches.items()}
        return output + adapters.scale * combine(parts, output, arch, tp), bias

    linear.forward = forward


def _qkv(parts: dict[str, torch.Tensor], like: torch.Tensor, arch: LlamaArch, tp: int) -> torch.Tensor:
    """q, k and v deltas laid out as this rank's linear_qkv rows: per query group, its q heads, k, v."""
    groups, hd = arch.num_kv_heads // tp, arch.head_dim
    lead = like.shape[:-1]
    widths = {"q": arch.heads_per_group * hd, "k": hd, "v": hd}
    pieces = [parts[t].reshape(*lead, groups, w) if t in parts else like.new_zeros(*lead, groups, w) for t, w in widths.items()]
    return torch.cat(pieces, dim=-1).reshape(like.shape)


def _fc1(parts: dict[str, torch.Tensor], like: torch.Tensor, arch: LlamaArch, tp: int) -> torch.Tensor:
    half = like.shape[-1] // 2
    return torch.cat([parts[t] if t in parts else like.new_zeros(*like.shape[:-1], half) for t in ("gate", "up")], dim=-1)


def _single(parts: dict[str, torch.Tensor], like: torch.Tensor, arch: LlamaArch, tp: int) -> torch.Tensor:
    (delta,) = parts.values()
    return delta


_COMBINE: dict[str, Callable[..., torch.Tensor]] = {
    "self_attention.linear_qkv": _qkv,
    "mlp.linear_fc1": _fc1,
    "self_attention.linear_proj": _single,
    "mlp.linear_fc2": _single,
}


class AdapterOff:
    """The reference policy of a LoRA actor: the actor's own model with its adapter off, so the
    base weights exist once. Answers what role_access asks of a colocated reference."""

    value_head = False

    def __init__(self, actor: Any):
        self.actor = actor

    def response_logprobs(self, batches: list) -> list[torch.Tensor]:
        with self.actor.adapters.off():
            return self.actor.response_logprobs(batches)

    def rows_over_dp(self, compute: Callable, batch: Any, micro_batch_size: int) -> torch.Tensor:
        return self.actor.rows_over_dp(compute, batch, micro_batch_size)
