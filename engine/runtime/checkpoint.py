"""Sharded checkpoints: one file per rank in a step folder that appears under its final name only
when every rank has written its part. A crash in the middle leaves the previous checkpoint whole.

The controller prepares the folder, every rank of the job (actor and roles on ranks of their own)
writes its part, and once all have (the caller's barrier), the controller commits.

    <root>/step-00000010/rank-00000.pt ... meta.json      a complete checkpoint
    <root>/.step-00000012.partial/                        being written (ignored, cleared on the next save)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config.progress import CheckpointStatus
from ..config.topology import EngineConfig
from .checkpoint_safety import CheckpointError, load_part

__all__ = [
    "CheckpointError",
    "checkpoint_root",
    "commit",
    "complete_steps",
    "load",
    "prepare",
    "rng_state",
    "set_rng_state",
    "status",
    "step_dir",
    "write_part",
]

_STEP = re.compile(r"^step-(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def complete_steps(root: Path) -> list[int]:
    """Steps with a complete checkpoint, oldest first."""
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _STEP.match(child.name)
        if match and (child / "meta.json").is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def _write_atomically(path: Path, write) -> None:
    part = path.with_name(path.name + ".part")
    with open(part, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


def _partial(root: Path, step: int) -> Path:
    return root / f".{step_dir(root, step).name}.partial"


def prepare(root: Path, step: int) -> None:
    """Controller, before any part is written: a fresh folder for the step's parts."""
    partial = _partial(root, step)
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()


def write_part(root: Path, step: int, rank: int, state: dict[str, Any]) -> None:
    """Every rank of the job, after `prepare`: its own state under its global rank."""
    _write_atomically(_partial(root, step) / f"rank-{rank:05d}.pt", lambda f: torch.save(state, f))


def commit(root: Path, step: int, world_size: int, keep: int, meta: dict[str, Any] | None = None) -> Path:
    """Controller, once every rank's part is written: the step folder appears whole, old ones go."""
    partial, final = _partial(root, step), step_dir(root, step)
    missing = [r for r in range(world_size) if not (partial / f"rank-{r:05d}.pt").is_file()]
    if missing:
        raise RuntimeError(f"checkpoint of step {step} lacks the parts of ranks {missing}")
    body = json.dumps({"step": step, "world_size": world_size, "time": time.time(), **(meta or {})}, indent=2).encode()
    _write_atomically(partial / "meta.json", lambda f: f.write(body))
    if final.exists():  # the same step saved again (a resumed run): replace it whole
        shutil.rmtree(final)
    os.replace(partial, final)
    for old in complete_steps(root)[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return final


def status(root: Path, step: int) -> CheckpointStatus:
    """The committed checkpoint of `step` as the progress report names it."""
    folder = step_dir(root, step)
    committed = json.loads((folder / "meta.json").read_text()).get("time")
    when = dt.datetime.fromtimestamp(committed, dt.timezone.utc) if isinstance(committed, (int, float)) else None
    return CheckpointStatus(step=step, path=str(folder), time=when)


def load(root: Path, step: int, rank: int, world_size: int) -> dict[str, Any]:
    """The part of global rank `rank`; the checkpoint must come from a job of the same world size."""
    folder = step_dir(root, step)
    meta = json.loads((folder / "meta.json").read_text())
    if meta["world_size"] != world_size:
        raise RuntimeError(f"{folder} was written by {meta['world_size']} ranks; this run has {world_size}: resume needs the same layout")
    return load_part(folder / f"rank-{rank:05d}.pt")


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def checkpoint_root(config: EngineConfig, base_dir: Path) -> Path:
    root = Path(config.trainer.checkpoint.path).expanduser()
    return root if root.is_absolute() else base_dir / root
