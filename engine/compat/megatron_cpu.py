"""Run megatron-core's CUDA-minded code paths on CPU, over gloo.

megatron-core assumes a GPU in a handful of places: it asks torch.cuda for the current device, saves
and restores CUDA RNG states for tensor-parallel regions, and passes device="cuda". On a machine
without CUDA those calls are redirected to the CPU equivalents; nothing else changes, which is why
CPU TP/PP/DP runs match a single process bit for bit. `apply()` does nothing when CUDA is present.
"""

from __future__ import annotations

import importlib
import sys
import types

import torch

_applied = False


def _cpu_device(*_args, **_kwargs) -> torch.device:
    return torch.device("cpu")


def _get_rng_state(*_args, **_kwargs) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(state: torch.Tensor, *_args, **_kwargs) -> None:
    torch.set_rng_state(state)


def _seed(seed: int) -> None:
    # Not torch.manual_seed: that one calls torch.cuda.manual_seed_all, which would recurse.
    torch.default_generator.manual_seed(int(seed))


def _causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


_FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "tensor",
    "arange",
    "rand",
    "randn",
    "randint",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "as_tensor",
)


def _on_cpu(device: object) -> object:
    if device == "cuda" or (isinstance(device, str) and device.startswith("cuda")) or isinstance(device, int):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


class _TorchOnCpu(types.ModuleType):
    """`torch` as seen by one megatron module: tensor factories asked for device="cuda" get the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self._wrapped = {name: self._redirect(getattr(torch, name)) for name in _FACTORIES}

    @staticmethod
    def _redirect(factory):
        def make(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            return factory(*args, **kwargs)

        return make

    def __getattr__(self, name: str):
        wrapped = self.__dict__.get("_wrapped", {})
        return wrapped[name] if name in wrapped else getattr(torch, name)


# megatron modules that create tensors with device="cuda" on the paths kuberl uses.
_MODULES_WITH_CUDA_TENSORS = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.pipeline_parallel.utils",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.data",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.transformer.module",
    "megatron.core.utils",
    "megatron.core.models.common.language_module.language_module",
)


# megatron's optimizers accept a parameter only if param.type() names a CUDA tensor type.
_TYPE_CHECKING_MODULES = frozenset(
    {
        "megatron.core.optimizer.optimizer",
        "megatron.core.optimizer.distrib_optimizer",
        "megatron.core.optimizer.clip_grads",
    }
)


def _cuda_type_names_for_megatron(original):
    def type_(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if args or kwargs or not isinstance(result, str):
            return result  # a conversion, not a question
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller in _TYPE_CHECKING_MODULES and result.startswith("torch.") and not result.startswith("torch.cuda."):
            return "torch.cuda." + result[len("torch.") :]
        return result

    return type_


def _alltoall_dispatcher_on_cpu() -> None:
    """megatron-core's all-to-all token dispatcher (expert parallelism) copies its split sizes to the host on a side
    CUDA stream and waits on an event for them: on the host there is nothing to copy or wait for, only the split
    sizes to turn into the lists all_to_all takes."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    def splits(value: object) -> object:
        return value.tolist() if isinstance(value, torch.Tensor) else value

    def on_host(self, point: str, tokens_per_expert: torch.Tensor | None = None) -> torch.Tensor | None:
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            self.input_splits, self.output_splits = splits(self.input_splits), splits(self.output_splits)
            self.output_splits_tp = splits(self.output_splits_tp)
        return tokens_per_expert

    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = types.SimpleNamespace()  # its __init__ makes a CUDA stream if None
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = on_host


def apply() -> bool:
    """Install the redirections once; returns whether they are active (False on a CUDA machine)."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as megatron_random
    from megatron.core.transformer import utils as transformer_utils

    # Monkeypatches: the replacements' signatures differ from torch.cuda's on purpose (a CPU device, any device).
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    torch.cuda.get_rng_state = _get_rng_state
    torch.cuda.set_rng_state = _set_rng_state  # type: ignore[assignment]
    torch.cuda.manual_seed = _seed
    torch.cuda.manual_seed_all = _seed
    megatron_random._get_cuda_rng_state = _get_rng_state
    megatron_random._set_cuda_rng_state = _set_rng_state
    # The default causal mask is built with device="cuda".
    transformer_utils.get_default_causal_mask = _causal_mask
    fused_softmax.get_default_causal_mask = _causal_mask
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.Tensor.type = _cuda_type_names_for_megatron(torch.Tensor.type)  # type: ignore[method-assign]
    # Without Transformer Engine, megatron-core 0.16.1's MoE router gating reads te_general_gemm, a name its
    # failed TE import never defined (NameError); None makes it take its torch.mm path.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    _alltoall_dispatcher_on_cpu()
    proxy = _TorchOnCpu()
    for name in _MODULES_WITH_CUDA_TENSORS:
        setattr(importlib.import_module(name), "torch", proxy)
    _applied = True
    return True
