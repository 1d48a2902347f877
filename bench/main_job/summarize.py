"""Summarise a finished run of the README's main job into bench/results/main_job.json (and copy its
reward curve next to it): greedy validation accuracy before and after, time, and the switch's share
of step time (both directions; the switch back counts only where reward scoring did not hide it), all read from the run folder that `kuberl run` wrote.

Usage: .venv/bin/kuberl run examples/grpo-smollm2-arith.yaml && .venv/bin/python bench/main_job/summarize.py
(with --baseline-run FOLDER: the same summary of a baseline tree's run, and the ratio of wall times)
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def summarize(run: Path) -> dict:
    """One finished run folder of the main job, summarised."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "reward_mean" in r]
    validation = [(r["step"], r["validation_reward_mean"]) for r in records if "validation_reward_mean" in r]
    step_seconds = sum(r["step_seconds"] for r in steps)
    reshard = sum(r["phase_seconds"].get("reshard", 0.0) for r in steps)
    # The switch back to training runs behind reward scoring; only its exposed rest is a phase.
    switch_back = sum(r["phase_seconds"].get("switch_back", 0.0) for r in steps)
    back_total = sum(r.get("switch_back_seconds", 0.0) for r in steps)
    back_hidden = sum(r.get("switch_back_hidden_seconds", 0.0) for r in steps)
    wall = (run / "reward_curve.png").stat().st_mtime - (run / "engine-config.json").stat().st_mtime
    return {
        "job": "examples/grpo-smollm2-arith.yaml",
        "steps": len(steps),
        "validation_greedy_accuracy": {str(step): round(value, 4) for step, value in validation},
        "before": validation[0][1],
        "after": validation[-1][1],
        "wall_seconds": round(wall, 1),
        "wall_minutes": round(wall / 60, 1),
        "mean_step_seconds": round(step_seconds / len(steps), 1),
        "phase_share": {
            p: round(sum(r["phase_seconds"].get(p, 0.0) for r in steps) / step_seconds, 4)
            for p in ("rollout", "reshard", "switch_back", "train", "validation", "checkpoint")
        },
        "reshard_share_of_step_time": round(reshard / step_seconds, 4),
        "switch_share_of_step_time": round((reshard + switch_back) / step_seconds, 4),
        "switch_back_seconds_total": round(back_total, 3),
        "switch_back_hidden_share": round(back_hidden / back_total, 4) if back_total > 0 else None,
        "rollout_tokens_per_second_mean": round(sum(r["rollout_tokens_per_second"] for r in steps) / len(steps), 1),
        "training_reward_first_5_steps": round(sum(r["reward_mean"] for r in steps[:5]) / 5, 4),
        "training_reward_last_5_steps": round(sum(r["reward_mean"] for r in steps[-5:]) / 5, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", nargs="?", default=str(REPO / "runs" / "grpo-smollm2-arith"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "main_job.json"))
    parser.add_argument(
        "--baseline-run", default=None, help="the run folder of the tree this one is compared with (run back to back on the same machine)"
    )
    parser.add_argument("--baseline-commit", default=None, help="the commit the baseline run was made from")
    parser.add_argument("--note", default=None, help="how this run and its baseline were made")
    args = parser.parse_args()
    summary = summarize(Path(args.run))
    if args.baseline_run is not None:
        baseline = summarize(Path(args.baseline_run))
        summary["baseline_wall_minutes"] = baseline["wall_minutes"]
        summary["wall_ratio_to_baseline"] = round(summary["wall_seconds"] / baseline["wall_seconds"], 3)
        summary["baseline_commit"] = args.baseline_commit
        summary["baseline"] = baseline
    if args.note:
        summary["note"] = args.note
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    shutil.copy(Path(args.run) / "reward_curve.png", Path(args.out).with_name("main_job_reward_curve.png"))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
