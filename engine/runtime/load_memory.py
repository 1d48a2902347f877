"""Out of memory while a model loads: the same model on the same nodes runs out again, so the job fails at once.

Mid-run, an out-of-memory error can be transient (a longer batch, a fragmented allocator) and the gang
restarts as for any other error. While a role's model is built from its checkpoint, nothing of the run
has happened yet: the weights, their gradients and the optimizer's state for the role's layout do not fit
the device, and a restart on the same node shape only fails the same way.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ..config.termination import NotRetryable


class OutOfMemoryAtLoad(NotRetryable, MemoryError):
    reason = "OutOfMemoryAtLoad"


def _device_memory() -> str:
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return f"the GPU has {total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free now"
    return "the CPU's memory (the container's limit) ran out"


def _out_of_memory(exc: BaseException) -> bool:
    # CUDA's allocator raises torch.OutOfMemoryError; the CPU's a plain RuntimeError saying so.
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(exc)


@contextmanager
def loading(role: str, parameters: int | None = None) -> Iterator[None]:
    """Build a role's model inside this: running out of memory becomes OutOfMemoryAtLoad, saying what to change."""
    try:
        yield
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        if isinstance(exc, NotRetryable) or not _out_of_memory(exc):
            raise
        size = f" ({parameters / 1e9:.2f}B parameters)" if parameters else ""
        raise OutOfMemoryAtLoad(
            f"roles.{role}: the model{size} ran out of memory while it loaded ({_device_memory()}): {exc}. "
            f"Split it over more ranks (roles.{role}.layout tp/pp), give its pods more memory "
            f"(roles.{role}.resources) or larger GPUs, or train LoRA adapters (trainer.lora)"
        ) from exc
