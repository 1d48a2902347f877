"""One real step of every preset, of every registered estimator and loss not covered by a whole job
elsewhere, and of the example plug-in preset and loss: two gloo ranks (DP=2) of the tiny model with
real Megatron and real vLLM, loaded once, each step with another algorithm (RLRun.use_algorithm).
Each step must end with finite metrics and moved weights."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "workers" / "algorithm_steps.py"
PLUGINS = Path(__file__).parents[2] / "examples" / "plugins"

# Wide clip ranges where a loss's own defaults would hold the tiny model's first step in place. The job has a
# colocated reference, so every step has a KL term, each with another estimator.
ALGORITHMS = [
    {"name": "dapo", "dapo": {"overlongBuffer": 2}},
    {"name": "gspo"},
    {"name": "cispo"},
    {"name": "dr_grpo"},
    {"name": "rloo", "policyLoss": {"name": "sapo"}},
    {"name": "reinforce_pp", "policyLoss": {"name": "gmpo"}},
    {"name": "grpo", "advantage": {"name": "remax"}, "policyLoss": {"name": "clip_cov", "options": {"fraction": 0.1}}},
    {"name": "grpo", "advantage": {"name": "grpo_passk"}, "policyLoss": {"name": "kl_cov", "options": {"fraction": 0.1}}},
    {"name": "grpo", "advantage": {"name": "opo"}, "oldLogprobs": "recompute", "tis": {"cap": 2.0}},
    {"name": "grpo", "advantage": {"name": "gpg"}, "policyLoss": {"name": "gpg"}, "lossAggregation": "seq_mean_token_sum_norm"},
    # The families added after verl's registries: GDPO, the optimal token baselines, DPPO, DRO, the bypass mode,
    # token_sum and lossScaleFactor, the abs and straight-through KL estimators, REINFORCE++'s gamma, CISPO's lower bound.
    {"name": "grpo", "klEstimator": "abs", "advantage": {"name": "gdpo"}, "policyLoss": {"name": "dppo_tv"}},
    {"name": "grpo", "klEstimator": "k3+", "advantage": {"name": "optimal_token_baseline"}, "policyLoss": {"name": "dro"}},
    {
        "name": "grpo",
        "klEstimator": "abs+",
        "klInReward": True,
        "advantage": {"name": "tir_optimal_token_baseline"},
        "policyLoss": {"name": "dppo_kl"},
    },
    {
        "name": "grpo",
        "klEstimator": "k1+",
        "lossAggregation": "token_sum",
        "policyLoss": {
            "name": "bypass",
            "options": {
                "lossType": "reinforce",
                "rolloutIs": "token",
                "aggregation": "token_sum",
                "isBatchNormalize": True,
                "rolloutRs": "token_k3",
                "rsThreshold": 0.5,
            },
        },
    },
    {
        "name": "reinforce_pp",
        "reinforcePp": {"gamma": 0.9},
        "lossAggregation": "seq_mean_token_sum_norm",
        "lossScaleFactor": 4,
        "policyLoss": {"name": "cispo", "options": {"clipLow": 0.5, "aggregation": "seq_mean_token_sum_norm"}},
    },
    # A preset and a loss from plug-in files (examples/plugins/; the estimator's whole job: tests/rl/test_runs.py).
    {"name": "rloo_dro", "plugins": [{"path": str(PLUGINS / "rloo_dro.py")}]},
    {"name": "grpo", "plugins": [{"path": str(PLUGINS / "soft_clip.py")}], "policyLoss": {"name": "soft_clip", "options": {"width": 0.5}}},
]
ALGORITHMS = [{"klCoef": 0.01, **a} for a in ALGORITHMS]


def test_every_preset_and_registered_entry_takes_a_real_step_dp2(make_job, tmp_path: Path) -> None:
    from kuberl.operator.cli.local_run import load_one
    from kuberl.operator.control.planner import engine_config
    from kuberl.operator.cli.ports import free_port

    job, run = make_job(optimizer={"lr": 1e-3}, roles={"ref": {"colocateWith": "actor"}}, algorithm={"name": "grpo", "klCoef": 0.01})
    config = engine_config(load_one(job)).model_copy(update={"master_port": free_port()})
    run.mkdir(parents=True)
    (run / "engine-config.json").write_text(config.model_dump_json(by_alias=True))
    out = tmp_path / "steps.jsonl"
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(config.master_port),
            "KUBERL_CONFIG": str(run / "engine-config.json"),
            "KUBERL_ROLE": "actor",
            "KUBERL_JOB": "tiny",
            "KUBERL_RUN_DIR": str(run),
            "KUBERL_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), "--algorithms", json.dumps(ALGORITHMS), "--out", str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["algorithm"]["name"] for s in steps] == [a["name"] for a in ALGORITHMS]
    for s in steps:
        what = json.dumps(s["algorithm"])
        assert s["moved"], f"{what}: the actor's weights did not change"
        for key in ("reward_mean", "policy_loss", "grad_norm", "rollout/mismatch_kl", "rollout/mismatch_max", "kl"):
            assert key in s and math.isfinite(s[key]), (what, key, s.get(key))
        assert s["update_skipped"] == 0.0, what
    dapo, recompute = steps[0], steps[8]
    assert dapo["dynamic_sampling/draws"] >= 1 and dapo["dynamic_sampling/groups_kept"] >= 1
    assert "reward/overlong_penalty" in dapo
    # Recomputed in float32, the trainer's log-probs match vLLM's nearly exactly, and the weights with them.
    assert recompute["rollout/mismatch_kl"] < 1e-3 and 0.5 < recompute["tis_weight_mean"] <= 2.0
    for s in steps:
        if not s["algorithm"].get("klInReward"):
            assert math.isfinite(s["kl_loss"]), s["algorithm"]
    # The bypass step judged its tokens (rejection sampling) and normalised its weights to mean 1.
    bypass = next(s for s in steps if s["algorithm"].get("policyLoss", {}).get("name") == "bypass")
    assert 0.0 <= bypass["rs_kept_fraction"] <= 1.0 and bypass["is_weight_mean"] == pytest.approx(1.0, abs=1e-3), bypass
    # The optimal token baselines ran their extra forward (the old policy's squared probabilities).
    assert steps[11]["phase_seconds"]["token_stats"] > 0 and steps[12]["phase_seconds"]["token_stats"] > 0
