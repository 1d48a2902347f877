"""Waiting for the rank processes a multi-process engine test starts (one per rank, as torchrun would)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def wait_for_ranks(procs: list[subprocess.Popen], logs: list[Path], timeout: float = 300) -> None:
    """Every rank exits 0; one that hangs (the others are then killed) or fails is named with its log's tail."""
    for r, proc in enumerate(procs):
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"rank {r} hung:\n{logs[r].read_text()[-3000:]}")
        assert code == 0, f"rank {r} failed:\n{logs[r].read_text()[-3000:]}"
