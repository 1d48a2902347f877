"""The examples that `kuberl run` runs on one machine, run as written (from a folder that looks like the
repository's root to them: they name .venv/ and examples/ by relative paths, and write ./runs/ there)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def root_like(tmp_path: Path) -> Path:
    """A folder with the repository's .venv and examples in it, where ./runs/ lands in the test's tmp_path."""
    root = tmp_path / "root"
    root.mkdir()
    for name in (".venv", "examples"):
        (root / name).symlink_to(REPO / name)
    return root


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_the_dpo_example_runs_as_written(kuberl_cli: str, tmp_path: Path) -> None:
    root = root_like(tmp_path)
    run = subprocess.run(
        [kuberl_cli, "run", "examples/dpo.yaml", "--metrics-port", "0"], cwd=root, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    steps = records(root / "runs" / "dpo-smollm2" / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]  # 64 pairs, 16 a step, one epoch
    assert all(0.0 <= r["reward_accuracy"] <= 1.0 and r["dpo_loss"] > 0 for r in steps)
    assert "reward=nan" not in run.stderr  # the progress bar shows what a DPO step reports
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(root / "runs" / "dpo-smollm2" / "final")
    assert model.config.num_hidden_layers == 30  # SmolLM2-135M


def test_the_main_job_runs_as_written_and_stops_at_a_step_boundary_on_sigterm(kuberl_cli: str, tmp_path: Path) -> None:
    """The README's main job, as written, for its first steps (the whole run is `make main-job`, minutes long):
    it converts the model, generates, scores and trains; SIGTERM stops it with a checkpoint of the step it was in."""
    root = root_like(tmp_path)
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(
        [kuberl_cli, "run", "examples/grpo-smollm2-arith.yaml", "--metrics-port", "0"],
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    metrics = root / "runs" / "grpo-smollm2-arith" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 600
        while len([r for r in records(metrics) if "reward_mean" in r]) < 2:
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no second step in 10 minutes"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 128 + signal.SIGTERM, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before, first = records(metrics)[:2]
    assert before["step"] == 0 and 0.05 <= before["validation_reward_mean"] <= 0.4  # held-out sums before training
    assert first["step"] == 1 and 0.0 <= first["reward_mean"] <= 1.0 and first["rollout_tokens_per_second"] > 0
    checkpoints = root / "runs" / "grpo-smollm2-arith" / "checkpoints"
    saved = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-"))
    assert saved and int(saved[-1].split("-")[1]) >= 2, saved


def test_the_agent_calculator_example_runs_shortened(kuberl_cli: str, tmp_path: Path) -> None:
    """examples/agent-calculator.yaml through `kuberl run` as its header says, shortened to two steps of two
    prompts (and no validation pass): SmolLM2-135M, prompted with the example's worked tool calls, calls the
    calculator of its own sampling; the tool results are in its trajectories but not in its trained tokens."""
    import yaml

    root = root_like(tmp_path)
    doc = yaml.safe_load((REPO / "examples" / "agent-calculator.yaml").read_text())
    spec = doc["spec"]
    spec["data"].pop("validation")
    spec["trainer"].pop("validationInterval")
    spec["trainer"].update(totalSteps=2, promptsPerStep=2, miniBatchSize=8)
    spec["rollout"]["samplesPerPrompt"] = 4
    (root / "agent-calculator.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    run = subprocess.run(
        [kuberl_cli, "run", "agent-calculator.yaml", "--metrics-port", "0"], cwd=root, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = root / "runs" / "agent-calculator"
    steps = [r for r in records(out / "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("policy_loss", "grad_norm", "reward_mean", "multi_turn/turns_mean", "multi_turn/tool_errors"):
            assert key in r and r[key] == r[key], (key, r)  # present and not NaN
        assert 0 < r["multi_turn/policy_token_share"] < 1  # tool results and the template's tokens are masked out
        assert 1 <= r["multi_turn/turns_mean"] <= 3
    # The model called the calculator, which ran: a call of its own sampled text (the few-shot turns are prompt).
    assert sum(r["multi_turn/tool_calls"] for r in steps) > 0, steps
    assert any("multi_turn/tool_seconds_mean" in r for r in steps)
    assert (out / "final" / "model.safetensors").exists() or any((out / "final").glob("*.safetensors"))
