"""One real step of every preset and of every registered estimator and loss not covered by a whole
job elsewhere: two gloo ranks (DP=2) of the tiny model with real Megatron and real vLLM, loaded
once, each step with another algorithm (RLRun.use_algorithm). Each step must end with finite
metrics and moved weights."""

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

# Wide clip ranges where a loss's own defaults would hold the tiny model's first step in place.
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
]


def test_every_preset_and_registered_entry_takes_a_real_step_dp2(make_job, tmp_path: Path) -> None:
    from kuberl.operator.local_run import load_one
    from kuberl.operator.planner import engine_config
    from kuberl.operator.ports import free_port

    job, run = make_job(optimizer={"lr": 1e-3})
    config = engine_config(load_one(job)).model_copy(update={"master_port": free_port()})
    run.mkdir(parents=True)
    (run / "engine-config.json").write_text(config.model_dump_json(by_alias=True))
    out = tmp_path / "steps.jsonl"
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(config.master_port), "KUBERL_CONFIG": str(run / "engine-config.json"), "KUBERL_ROLE": "actor",
               "KUBERL_JOB": "tiny", "KUBERL_RUN_DIR": str(run), "KUBERL_THREADS": "1", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), "--algorithms", json.dumps(ALGORITHMS), "--out", str(out)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["algorithm"]["name"] for s in steps] == [a["name"] for a in ALGORITHMS]
    for s in steps:
        what = json.dumps(s["algorithm"])
        assert s["moved"], f"{what}: the actor's weights did not change"
        for key in ("reward_mean", "policy_loss", "grad_norm", "rollout/mismatch_kl", "rollout/mismatch_max"):
            assert key in s and math.isfinite(s[key]), (what, key, s.get(key))
        assert s["update_skipped"] == 0.0, what
    dapo, recompute = steps[0], steps[8]
    assert dapo["dynamic_sampling/draws"] >= 1 and dapo["dynamic_sampling/groups_kept"] >= 1
    assert "reward/overlong_penalty" in dapo
    # Recomputed in float32, the trainer's log-probs match vLLM's nearly exactly, and the weights with them.
    assert recompute["rollout/mismatch_kl"] < 1e-3 and 0.5 < recompute["tis_weight_mean"] <= 2.0
