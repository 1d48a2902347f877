"""The engine's one table of dtypes: manifest name, torch dtype and vLLM's name for it."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
VLLM_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def torch_dtype(name: str) -> torch.dtype:
    """A manifest's `dtype` (model.dtype, reward.model.dtype) as torch's; auto is bfloat16 on GPUs and float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return TORCH_DTYPES[name]


def vllm_dtype(dtype: torch.dtype) -> str:
    return VLLM_NAMES[dtype]


def is_half(dtype: torch.dtype) -> bool:
    """Whether vLLM's and the trainer's kernels round differently enough to need recomputed log-probs."""
    return dtype in (torch.bfloat16, torch.float16)
