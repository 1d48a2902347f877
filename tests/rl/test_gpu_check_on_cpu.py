"""`kuberl gpu-check` (and bench/gpu_check.py, its checkout's entry) runs on a GPU only where one is lent
(rarely): its CPU mode runs the same code on the tiny model here, through the command a GPU node runs, so
that it cannot drift from the engine's API unnoticed. The device-memory checks (vLLM sleep, optimizer
offload) are GPU-only and not part of this run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kuberl.operator.cli.ports import free_port

KUBERL = Path(sys.executable).parent / "kuberl"
CHECK = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def test_the_gpu_check_passes_on_cpu_less_its_device_memory_checks(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = subprocess.run(
        [str(KUBERL), "gpu-check", "--cpu", "--model", str(tiny_model), "--port", str(free_port()), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(out.read_text())
    assert report["checks"] == {"packed_matches_padded": True, "completions_changed": True, "finite_grad_norms": True}
    assert report["packed_vs_padded_max_abs_logprob"] < 1e-4
    assert report["vllm_generated_tokens"] > 0 and report["update_bytes"] > 0


def test_the_checkouts_entry_is_the_same_command() -> None:
    done = subprocess.run([sys.executable, str(CHECK), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: kuberl gpu-check"), done.stdout + done.stderr
    assert "--model" in done.stdout and "--cpu" in done.stdout
