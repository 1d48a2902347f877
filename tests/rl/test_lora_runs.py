"""LoRA jobs (trainer.lora) through `kuberl run` on the tiny model: the adapter trains under TP and PP,
vLLM samples with it, the switch moves the adapter alone, checkpoints hold the adapter and its
optimizer state, a resume is exact, and the PEFT export loads in `peft`."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from .test_runs import records

pytestmark = pytest.mark.slow
LORA = {"rank": 4, "alpha": 8}


def test_lora_grpo_tp2_moves_the_adapter_only_and_exports_it_for_peft(make_job, run_job, tiny_model: Path, tmp_path: Path) -> None:
    job, run = make_job(
        algorithm={"name": "grpo", "klCoef": 0.05},
        roles={"ref": {"colocateWith": "actor"}},
        layout={"tp": 2},
        optimizer={"lr": 1e-2},
        lora={**LORA, "mergedExportPath": str(tmp_path / "run" / "merged")},
    )
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in records(run) if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["kl"] == 0.0  # the fresh adapter (B = 0) is the reference: the base with it off
    for r in steps:
        assert r["adapter_bytes"] > 0 and r["switch_bytes"] == r["adapter_bytes"]
        assert r["switch_full_bytes"] >= 100 * r["adapter_bytes"]
        assert 0 < r["adapter_received_bytes"] < r["adapter_bytes"]  # the other TP rank's shards
    # The checkpoint: the adapter, its optimizer state and the base it applies to; no base weights.
    step = run / "ckpt" / "step-00000002"
    part = torch.load(step / "rank-00000.pt", weights_only=False)["actor"]
    assert set(part) == {"adapter", "dropout_rng", "optimizer"} and all(".lora_" in k for k in part["adapter"])
    meta = json.loads((step / "meta.json").read_text())
    assert meta["base_model"]["path"] == str(tiny_model) and meta["lora"]["rank"] == 4
    # The export: a PEFT folder that peft loads onto the base, equal to the merged export.
    import peft
    import transformers

    config = json.loads((run / "final" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(base, run / "final").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(run / "merged", dtype=torch.float32).eval()
    ids = torch.tensor([[1, 2, 3, 400, 17, 9000]])
    with torch.no_grad():
        a, b = with_adapter(ids).logits, merged(ids).logits
        plain = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)(ids).logits
    assert (a - b).abs().max() < 1e-5
    assert (a - plain).abs().max() > 1e-4  # the adapter trained


STOP_STEPS = 8


def test_lora_resume_after_sigterm_is_exact_pp2(make_job, run_job, start_training) -> None:
    from safetensors.torch import load_file

    from kuberl.engine.runtime.checkpoint import complete_steps

    straight_job, straight = make_job("straight", steps=STOP_STEPS, layout={"pp": 2}, lora=LORA, optimizer={"lr": 1e-2})
    result = run_job(straight_job, straight)
    assert result.returncode == 0, result.stderr[-3000:]
    job, resumed = make_job("resumed", steps=STOP_STEPS, layout={"pp": 2}, checkpoint_interval=1000, lora=LORA, optimizer={"lr": 1e-2})
    proc, _ = start_training(job, resumed)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped_at = records(resumed)[-1]["step"]
    assert 1 <= stopped_at < STOP_STEPS and complete_steps(resumed / "ckpt") == [stopped_at]
    result = run_job(job, resumed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in records(resumed)] == list(range(1, STOP_STEPS + 1))
    a, b = (load_file(run / "final" / "adapter_model.safetensors") for run in (straight, resumed))
    assert a.keys() == b.keys() and len(a) == 2 * 7 * 2  # 2 layers, 7 targets, A and B
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after a stop and resume"
    assert records(straight)[-1]["reward_mean"] == records(resumed)[-1]["reward_mean"]


def test_lora_dpo_starts_at_its_reference_the_base_with_the_adapter_off(make_job, run_job, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"prompt": f"What is {a} + 1?", "chosen": str(a + 1), "rejected": str(a + 7)}) + "\n" for a in range(4))
    )
    job, run = make_job(
        algorithm={"name": "dpo", "dpo": {"beta": 0.1}},
        roles={"ref": {"colocateWith": "actor"}},
        data={"train": {"path": str(pairs)}, "maxPromptLength": 64, "chosenField": "chosen", "rejectedField": "rejected"},
        steps=2,
        microBatchSize=2,
        lora=LORA,
        optimizer={"lr": 1e-2},
    )
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = records(run)
    assert steps[0]["dpo_loss"] == pytest.approx(0.6931471805599453, abs=1e-6)  # log 2: policy == reference
    assert steps[1]["reward_margin"] > 0
    assert (run / "final" / "adapter_config.json").is_file()


def test_lora_ppo_with_a_full_critic(make_job, run_job) -> None:
    job, run = make_job(
        algorithm={"name": "ppo", "ppo": {"gae": {"gamma": 1.0, "lambda": 0.95}}},
        roles={"critic": {"colocateWith": "actor"}},
        samples=2,
        lora=LORA,
    )
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in records(run) if "reward_mean" in r]
    assert len(steps) == 2 and all(r["adapter_bytes"] > 0 and "critic/value_loss" in r for r in steps)
