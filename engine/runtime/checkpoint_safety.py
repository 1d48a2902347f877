"""Loading a checkpoint part without running code from it.

A checkpoint folder is writable by whatever runs as the trainer's user (a tool's code, another job
sharing the volume), and a pickle runs any callable it names while it loads. So parts load with
`torch.load(weights_only=True)`: tensors, containers and plain Python values, plus the few
numpy types the engine legitimately stores (numpy's RNG state is a tuple holding a uint32 array).
Anything else names a global outside that list and is refused before it is called.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config.termination import NotRetryable


class CheckpointError(NotRetryable, RuntimeError):
    """A checkpoint part that the engine refuses to load; the message names the file, what is wrong and what to do."""

    reason = "CheckpointRefused"


def _numpy_globals() -> list[Any]:
    """What numpy's `get_state()` pickles into: an ndarray of uint32 and the dtype it carries."""
    from numpy._core.multiarray import _reconstruct  # numpy 2: the array's pickle constructor

    return [np.ndarray, np.dtype, _reconstruct, type(np.dtype(np.uint32))]


SAFE_GLOBALS: tuple[Any, ...] = tuple(_numpy_globals())
"""The globals a checkpoint part may name beyond what `weights_only` already allows."""


def load_part(path: Path) -> dict[str, Any]:
    """One rank's part: tensors and the allow-listed values only, or CheckpointError naming `path`."""
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
            state = torch.load(path, weights_only=True)  # tensors back on the device they were saved from, as before
    except pickle.UnpicklingError as exc:
        refused = _refused_globals(path)
        what = (
            f"it names code to run while loading ({', '.join(refused)})" if refused else f"it is not a safe checkpoint ({_first_line(exc)})"
        )
        raise CheckpointError(
            f"checkpoint part {path} refused: {what}; a kuberl checkpoint holds tensors, numbers and RNG state only. "
            "It was not written by kuberl or was tampered with: delete its step folder to resume from an earlier "
            "checkpoint, or from the start"
        ) from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise CheckpointError(
            f"checkpoint part {path} cannot be read ({_first_line(exc)}): it is damaged or incomplete; "
            "delete its step folder to resume from an earlier checkpoint"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(
            f"checkpoint part {path} holds a {type(state).__name__}, not a rank's state: "
            "delete its step folder to resume from an earlier checkpoint"
        )
    return state


def _refused_globals(path: Path) -> list[str]:
    try:
        allowed = {f"{g.__module__}.{g.__qualname__}" for g in SAFE_GLOBALS}
        return [name for name in torch.serialization.get_unsafe_globals_in_checkpoint(path) if name not in allowed][:5]
    except Exception:  # noqa: BLE001 - only for the message; the refusal stands either way
        return []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
