"""Checkpoint parts load without running code: what the engine stores comes back whole, a planted
pickle is refused with the file named and its code never runs."""

from __future__ import annotations

import builtins
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from kuberl.engine.runtime import checkpoint as ckpt
from kuberl.engine.runtime.checkpoint_safety import CheckpointError


class _Planted:
    """What an attacker pickles: loading it calls open(marker, "w"), creating the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return builtins.open, (str(self.marker), "w")


def _save_step(root: Path, state: dict, step: int = 3) -> Path:
    ckpt.prepare(root, step)
    ckpt.write_part(root, step, 0, state)
    return ckpt.commit(root, step, world_size=1, keep=2)


def test_what_the_engine_stores_loads_back_whole(tmp_path: Path) -> None:
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    generator = torch.Generator().manual_seed(3)
    state = {
        "actor": {
            "model": {"w": torch.randn(3, 4)},
            "dropout_rng": generator.get_state(),
            "optimizer": [
                {
                    "common": {"optimizer": {"state": {}, "param_groups": [{"lr": 1e-5, "params": [0, 1]}]}, "grad_scaler": None},
                    "params": [{"exp_avg": torch.zeros(2), "step": torch.tensor(4.0)}],
                }
            ],
        },
        "loader": {"epoch": 1, "position": 8},
        "step": 3,
        "updates": 6,
        "rng": ckpt.rng_state(),
    }
    _save_step(tmp_path, state)
    loaded = ckpt.load(tmp_path, 3, 0, 1)
    assert torch.equal(loaded["actor"]["model"]["w"], state["actor"]["model"]["w"])
    assert loaded["loader"] == {"epoch": 1, "position": 8} and loaded["actor"]["optimizer"][0]["common"]["grad_scaler"] is None
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    ckpt.set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


@pytest.mark.parametrize("where", ["top", "nested in the optimizer state"])
def test_a_planted_pickle_is_refused_naming_the_file_and_its_code_never_runs(tmp_path: Path, where: str) -> None:
    marker = tmp_path / "pwned"
    root = tmp_path / "ckpt"
    folder = _save_step(root, {"step": 3, "rng": ckpt.rng_state()})
    part = folder / "rank-00000.pt"
    planted = _Planted(marker) if where == "top" else {"step": 3, "actor": {"optimizer": [{"common": _Planted(marker)}]}}
    torch.save(planted, part)  # a tool or another tenant overwrites the part
    with pytest.raises(CheckpointError) as caught:
        ckpt.load(root, 3, 0, 1)
    message = str(caught.value)
    assert str(part) in message and "io.open" in message and "delete its step folder" in message, message
    assert not marker.exists()
    # The attack is real: a plain unpickling of the same file creates the marker.
    torch.load(part, weights_only=False)
    assert marker.exists()


def test_a_raw_pickle_not_in_torchs_format_is_refused_too(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    folder = _save_step(tmp_path / "ckpt", {"step": 3})
    part = folder / "rank-00000.pt"
    part.write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.raises(CheckpointError, match=str(part)):
        ckpt.load(tmp_path / "ckpt", 3, 0, 1)
    assert not marker.exists()


def test_a_damaged_part_is_a_clear_error(tmp_path: Path) -> None:
    folder = _save_step(tmp_path / "ckpt", {"step": 3})
    (folder / "rank-00000.pt").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(CheckpointError, match="cannot be read"):
        ckpt.load(tmp_path / "ckpt", 3, 0, 1)
