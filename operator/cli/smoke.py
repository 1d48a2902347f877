"""`kuberl smoke`: the first thing to run after installing. One GRPO step of a tiny random model over
2 or 4 local ranks with the hybrid engine on (TP=2 training, one vLLM replica per rank), then a
plain report of what ran and whether it worked."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from .local_run import run_local


def smoke_manifest(model: Path, run: Path, ranks: int) -> dict:
    return {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "kuberl-smoke"},
        "spec": {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"train": {"generator": {"name": "arithmetic", "count": 16, "seed": 0, "maxOperand": 9}}, "maxPromptLength": 96},
            "algorithm": {"name": "grpo"},
            "rollout": {"samplesPerPrompt": 4, "maxNewTokens": 8, "kvCacheBytes": 32 << 20},
            # A random model never answers right; the length term gives the step a gradient to take.
            "reward": {"rules": [{"name": "math_answer"}, {"name": "length_penalty", "args": {"max_chars": 2}}]},
            "roles": {"actor": {"replicas": 1, "gpusPerReplica": ranks, "layout": {"tp": 2, "dp": ranks // 2}}},
            "trainer": {
                "totalSteps": 1,
                "promptsPerStep": 4,
                "microBatchSize": 4,
                "seed": 0,
                "checkpoint": {"path": str(run / "checkpoints"), "interval": 1, "keep": 1},
            },
            "monitoring": {"enabled": False},
        },
    }


def smoke(ranks: int = 2, keep: bool = False) -> int:
    if ranks not in (2, 4):
        print("kuberl smoke: --ranks must be 2 or 4", file=sys.stderr)
        return 2
    from kuberl.engine.models.tiny import make_tiny_model

    work = Path(tempfile.mkdtemp(prefix="kuberl-smoke-"))
    try:
        model = make_tiny_model(work / "model")
        job = work / "smoke.yaml"
        job.write_text(yaml.safe_dump(smoke_manifest(model, work / "run", ranks), sort_keys=False))
        code = run_local(job, run_dir=work / "run")
        metrics = work / "run" / "metrics.jsonl"
        if code != 0 or not metrics.exists():
            print(f"\nkuberl smoke: FAILED (exit {code}); logs in {work / 'run' / 'logs'}")
            keep = True
            return code or 1
        step = [json.loads(line) for line in metrics.read_text().splitlines()][-1]
        print(report(step, ranks))
        return 0
    finally:
        if keep:
            print(f"kuberl smoke: files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(step: dict, ranks: int) -> str:
    phases = step["phase_seconds"]
    switch = phases.get("reshard", 0.0)
    lines = [
        "",
        f"kuberl smoke: one GRPO step on {ranks} local ranks",
        f"  training layout : TP=2 PP=1 DP={ranks // 2} (megatron-core)",
        f"  rollout layout  : TP=1, {ranks} vLLM replicas (one per rank)",
        f"  rollout         : {phases.get('rollout', 0.0):.2f} s, {step['rollout_tokens_per_second']:.0f} tokens/s",
        f"  switch          : to rollout {switch:.3f} s, {step['reshard_bytes'] / 1e6:.2f} MB gathered by rank 0; "
        f"back to training {step['switch_back_seconds']:.3f} s; hidden behind reward scoring: "
        f"{100 * step['switch_hidden_share']:.0f}% ({step['switch_back_hidden_seconds']:.3f} s; on CPU there is "
        "no optimizer state to move back, so little to hide)",
        f"  training        : {phases.get('train', 0.0):.2f} s, policy loss {step['policy_loss']:.4f}, grad norm {step['grad_norm']:.3f}",
        f"  reward          : {step['reward_mean']:.3f} (a random model: negative, its answers are long and wrong)",
    ]
    ok = (
        all(isinstance(step.get(k), float) for k in ("policy_loss", "grad_norm", "reward_mean"))
        and step["reshard_bytes"] > 0
        and step["grad_norm"] > 0
    )
    lines.append("kuberl smoke: OK, everything worked." if ok else "kuberl smoke: FAILED: the step's numbers are incomplete.")
    return "\n".join(lines)
