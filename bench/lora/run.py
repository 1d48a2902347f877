"""The main job with LoRA beside the main job with full fine-tuning, back to back on this machine, in one invocation.

Every run is examples/grpo-smollm2-arith.yaml through `kuberl run` (30 steps of GRPO on SmolLM2-135M):
full fine-tuning at the example's learning rate, then LoRA (trainer.lora) at each of three learning
rates (by default 5e-5, 1e-4 and 2e-4: around ten times the full rate, by factors of 2, as docs/lora.md
advises). Reported per run: greedy held-out accuracy at each validation, wall time, the switch's bytes
handed to vLLM per step and its share of step time, the checkpoint's size on disk and the optimizer
state's bytes (Adam's moments; fp32 main parameters are the model's own), trainable parameters. The
comparison is full fine-tuning against the best LoRA run (the highest held-out accuracy at the end).
Results: bench/results/lora.json.

Usage: .venv/bin/python bench/lora/run.py [--rank 4] [--lora-lrs 5e-5 1e-4 2e-4]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "grpo-smollm2-arith.yaml"


def _summarize():
    spec = importlib.util.spec_from_file_location("summarize", REPO / "bench" / "main_job" / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.summarize


def job_file(work: Path, name: str, lora: dict | None, lr: float) -> Path:
    doc = yaml.safe_load(JOB.read_text())
    trainer = doc["spec"]["trainer"]
    trainer["checkpoint"]["path"] = str(work / name / "checkpoints")
    trainer["exportPath"] = str(work / name / "final")
    trainer["optimizer"]["lr"] = lr
    if lora is not None:
        trainer["lora"] = lora
    doc["spec"]["monitoring"] = {"enabled": False}  # no metrics port: other runs on this machine may hold it
    doc["metadata"]["name"] = f"main-job-{name}"
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def measure(run: Path, checkpoints: Path) -> dict:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "reward_mean" in r]
    last = sorted(checkpoints.glob("step-*"))[-1]
    part = torch.load(last / "rank-00000.pt", weights_only=False)["actor"]
    weights = part.get("adapter", part.get("model", {}))
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / len(steps)  # noqa: E731
    return {
        "switch_bytes_per_step": round(mean("switch_bytes")),
        "switch_full_bytes": round(mean("switch_full_bytes")),
        "switch_seconds_per_step": round(mean("reshard_seconds"), 4),
        "switch_share_of_step_time": round(
            sum(r["phase_seconds"].get("reshard", 0.0) for r in steps) / sum(r["step_seconds"] for r in steps), 4
        ),
        "checkpoint_bytes": sum(f.stat().st_size for f in last.iterdir()),
        "checkpoint_weight_bytes": tensor_bytes(weights),
        "optimizer_state_bytes": tensor_bytes(part["optimizer"]),
        "trainable_parameters": sum(t.numel() for t in weights.values()),
    }


def run_one(work: Path, name: str, lora: dict | None, lr: float) -> dict:
    shutil.rmtree(work / name, ignore_errors=True)
    job = job_file(work, name, lora, lr)
    started = time.perf_counter()
    result = subprocess.run(
        [str(REPO / ".venv" / "bin" / "kuberl"), "run", str(job), "--out", str(work / name / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"{name} failed:\n{result.stderr[-3000:]}")
    return summarize_one(work, name, lora, lr, seconds=time.perf_counter() - started)


def summarize_one(work: Path, name: str, lora: dict | None, lr: float, seconds: float | None) -> dict:
    summary = _summarize()(work / name / "run")
    summary.update(measure(work / name / "run", work / name / "checkpoints"))
    summary["process_seconds"] = round(seconds, 1) if seconds is not None else None
    summary["lr"] = lr
    if lora is not None:
        summary["lora"] = lora
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--lora-lrs", type=float, nargs="+", default=[5e-5, 1e-4, 2e-4])
    parser.add_argument("--full-lr", type=float, default=yaml.safe_load(JOB.read_text())["spec"]["trainer"]["optimizer"]["lr"])
    parser.add_argument("--work", default=str(REPO / "runs" / "bench-lora"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "lora.json"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out: dict = {
        "job": "examples/grpo-smollm2-arith.yaml",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{shutil.os.cpu_count()} cores",
        "load_average_at_start": [round(x, 1) for x in shutil.os.getloadavg()],
    }
    spec = {"rank": args.rank, "alpha": args.alpha}
    full = run_one(work, "full", None, args.full_lr)
    runs = [run_one(work, f"lora-{lr:.0e}", spec, lr) for lr in args.lora_lrs]  # 1e-04: a DNS label, as the job name must be
    lora = max(runs, key=lambda r: r["after"])
    out.update(full=full, lora=lora, lora_runs=runs)
    out["comparison"] = {
        "accuracy_after_points": round(100 * (lora["after"] - full["after"]), 1),
        "wall_ratio": round(lora["wall_seconds"] / full["wall_seconds"], 3),
        "switch_bytes_ratio": round(full["switch_bytes_per_step"] / max(lora["switch_bytes_per_step"], 1), 1),
        "checkpoint_ratio": round(full["checkpoint_bytes"] / lora["checkpoint_bytes"], 1),
        "optimizer_state_ratio": round(full["optimizer_state_bytes"] / max(lora["optimizer_state_bytes"], 1), 1),
    }
    out["load_average_at_end"] = [round(x, 1) for x in shutil.os.getloadavg()]
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
