"""A checkpoint part planted between two attempts of a job (by a tool, or a tenant sharing the volume):
the resume is refused, the job's error names the file, and the planted code never runs."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
import torch

from kuberl.engine.runtime.checkpoint import complete_steps

pytestmark = pytest.mark.slow


class _Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return builtins.open, (str(self.marker), "w")


def test_a_planted_pickle_checkpoint_is_refused_on_resume_and_never_runs(make_job, run_job, tmp_path: Path) -> None:
    job, run = make_job("planted", steps=1, checkpoint_interval=1)
    first = run_job(job, run)
    assert first.returncode == 0, first.stderr[-3000:]
    [step] = complete_steps(run / "ckpt")
    part = run / "ckpt" / f"step-{step:08d}" / "rank-00000.pt"
    marker = tmp_path / "planted-code-ran"
    torch.save({"step": step, "actor": _Planted(marker)}, part)

    job, run = make_job("planted", steps=2, checkpoint_interval=1)  # the next attempt resumes
    second = run_job(job, run)
    assert second.returncode == 1, second.stderr[-3000:]
    assert "CheckpointError" in second.stderr and str(part) in second.stderr, second.stderr[-3000:]
    assert not marker.exists()
