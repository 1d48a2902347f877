"""The main job on separate placement (maxStaleness 1) beside the colocated run, on the same cores, in one invocation.

Both train examples/grpo-smollm2-arith.yaml as it is (30 steps, greedy validation on its 100 held-out
sums every 10 steps), one after the other under `kuberl run`, on the same CPU threads in all:
- colocated: the actor's one rank generates and trains, with --threads 2;
- separate: the actor's rank trains and a rollout rank of its own generates (rollout.placement:
  separate, roles.rollout one replica, algorithm.async.maxStaleness 1), with --threads 1 each.
Reported for each: wall time, completions per second (the training steps' completions over the sum of
their step times, checkpoints left out), greedy held-out accuracy at each validation step, and for the
separate run the mean share of step time the trainers waited for the fleet and the fleet's idle share.

Usage: .venv/bin/python bench/async/run.py [--steps 30] [--staleness 1]
Writes bench/results/async.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "grpo-smollm2-arith.yaml"
COMPLETIONS_PER_STEP = 32  # the example's 4 prompts x 8 samples


def job(work: Path, name: str, steps: int, staleness: int | None) -> Path:
    """The example, moved under `work`, as colocated (staleness None) or separate placement."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    doc["metadata"]["name"] = name
    spec["model"]["gguf"] = str(REPO / spec["model"]["gguf"])
    spec["trainer"].update(
        totalSteps=steps,
        checkpoint={"path": str(work / name / "checkpoints"), "interval": 1000, "keep": 1},
        exportPath=str(work / name / "final"),
    )
    spec["monitoring"] = {"enabled": False}
    if staleness is not None:
        spec["rollout"]["placement"] = "separate"
        spec["roles"]["rollout"] = {"replicas": 1}
        spec["algorithm"]["async"] = {"maxStaleness": staleness}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(work: Path, name: str, steps: int, staleness: int | None) -> dict:
    manifest = job(work, name, steps, staleness)
    threads = "2" if staleness is None else "1"
    started = time.perf_counter()
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "kuberl"), "run", str(manifest), "--out", str(work / name), "--threads", threads],
        check=True,
        cwd=REPO,
    )
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [r for r in records if "reward_mean" in r]
    # Validation runs at its own steps in both runs alike; checkpoints are left out as the other benches do.
    seconds = sum(
        r["step_seconds"] - r["phase_seconds"].get("checkpoint", 0.0) - r["phase_seconds"].get("validation", 0.0) for r in trained
    )
    out = {
        "threads_per_rank": int(threads),
        "ranks": 1 if staleness is None else 2,
        "wall_seconds": round(wall, 1),
        "training_seconds": round(seconds, 1),
        "completions_per_second": round(len(trained) * COMPLETIONS_PER_STEP / seconds, 2),
        "validation_greedy_accuracy": {
            str(r["step"]): round(r["validation_reward_mean"], 4) for r in records if "validation_reward_mean" in r
        },
        "training_reward_last_5_steps": round(sum(r["reward_mean"] for r in trained[-5:]) / 5, 4),
    }
    if staleness is not None:
        out["max_staleness"] = staleness
        out["staleness_max_seen"] = max(r["staleness"] for r in trained)
        out["trainer_idle_fraction_mean"] = round(sum(r["trainer_idle_fraction"] for r in trained) / len(trained), 4)
        out["rollout_idle_fraction_mean"] = round(sum(r["rollout_idle_fraction"] for r in trained) / len(trained), 4)
    else:
        # What the colocated trainer spends generating: the share the separate placement can take off it.
        out["rollout_share_of_step_time"] = round(sum(r["phase_seconds"].get("rollout", 0.0) for r in trained) / seconds, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "async.json"))
    args = parser.parse_args()
    load_at_start = [round(x, 1) for x in os.getloadavg()]  # a quiet machine reads about 0
    with tempfile.TemporaryDirectory(prefix="kuberl-async-bench-") as tmp:
        work = Path(tmp)
        colocated = run(work, "colocated", args.steps, None)
        separate = run(work, "separate", args.steps, args.staleness)
    common = sorted(set(colocated["validation_greedy_accuracy"]) & set(separate["validation_greedy_accuracy"]), key=int)
    result = {
        "job": "examples/grpo-smollm2-arith.yaml",
        "steps": args.steps,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "colocated": colocated,
        "separate": separate,
        "wall_ratio_colocated_over_separate": round(colocated["wall_seconds"] / separate["wall_seconds"], 3),
        "completions_per_second_ratio_separate_over_colocated": round(
            separate["completions_per_second"] / colocated["completions_per_second"], 3
        ),
        "accuracy_points_separate_minus_colocated": {
            step: round(100 * (separate["validation_greedy_accuracy"][step] - colocated["validation_greedy_accuracy"][step]), 1)
            for step in common
        },
        "date": time.strftime("%Y-%m-%d"),
        "load_average_at_start": load_at_start,
        "load_average_at_end": [round(x, 1) for x in os.getloadavg()],
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
