"""Multi-turn jobs through `kuberl run` on the tiny model: 2 ranks, trajectories of several turns
(examples/plugins/guess_number.py answers every turn), and a resumed run equal to an uninterrupted one."""

from __future__ import annotations

import math
import signal
from pathlib import Path

import pytest
import torch

from .test_runs import exported, records

pytestmark = pytest.mark.slow
GUESS = Path(__file__).parents[2] / "examples" / "plugins" / "guess_number.py"
STEPS = 6


def multi_turn_job(make_job, name: str, steps: int, **kwargs):
    return make_job(
        name,
        steps=steps,
        algorithm={"name": "grpo", "plugins": [{"path": str(GUESS)}]},
        rollout={"multiTurn": {"environment": "guess_number", "environmentOptions": {"reward": 1.0}, "maxTurns": 3, "maxTotalTokens": 48}},
        reward={"rules": [{"name": "math_answer"}]},
        **kwargs,
    )


def test_multi_turn_grpo_over_two_ranks(make_job, run_job) -> None:
    job, run = multi_turn_job(make_job, "mt", steps=2)
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in records(run) if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("policy_loss", "grad_norm", "multi_turn/turns_mean", "multi_turn/policy_token_share"):
            assert math.isfinite(r[key]), (key, r)
        # The random policy rarely guesses right: most trajectories take all three turns, and the
        # environment's replies are in the sequences but not the policy's tokens.
        assert 1.5 < r["multi_turn/turns_mean"] <= 3
        assert 0.2 < r["multi_turn/policy_token_share"] < 0.8
        assert r["response_length_mean"] > 6  # longer than one turn of at most maxNewTokens
        assert r["multi_turn/tool_calls"] == 0
        # A prompt's 4 trajectories share one copy of it in the packed rows.
        assert r["train_positions_per_token"] < 1
        # The trainer's log-probs of the policy's tokens are vLLM's: every masked-in position is one
        # the policy sampled, at the place it sampled it (a mask off by one token would show here).
        assert r["rollout/mismatch_max"] < 1e-3, r
    assert "reward/environment" in steps[0] or "reward/math_answer" in steps[0]


def test_multi_turn_on_a_tensor_parallel_vllm_replica(make_job, run_job) -> None:
    # rolloutTp = 2: both ranks drive one vLLM replica; the first steps the environments and the
    # other takes its answers, so both generate every turn from the same conversations.
    job, run = multi_turn_job(make_job, "mt-tp", steps=1, layout={"tp": 2, "rolloutTp": 2})
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    [r] = [r for r in records(run) if "reward_mean" in r]
    assert 1.5 < r["multi_turn/turns_mean"] <= 3 and math.isfinite(r["policy_loss"])
    assert r["rollout/mismatch_max"] < 1e-3, r  # vLLM's log-probs are the trainer's: the replica sampled what it was given


def test_a_resumed_multi_turn_run_equals_an_uninterrupted_one(make_job, run_job, start_training) -> None:
    from kuberl.engine.runtime.checkpoint import complete_steps

    straight_job, straight = multi_turn_job(make_job, "straight", steps=STEPS)
    result = run_job(straight_job, straight)
    assert result.returncode == 0, result.stderr[-3000:]
    job, resumed = multi_turn_job(make_job, "resumed", steps=STEPS, checkpoint_interval=1000)
    proc, _ = start_training(job, resumed)  # step 1 is done
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped_at = records(resumed)[-1]["step"]
    assert 1 <= stopped_at < STEPS, "the run should have stopped early"
    assert complete_steps(resumed / "ckpt") == [stopped_at]

    result = run_job(job, resumed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in records(resumed)] == list(range(1, STEPS + 1))
    a, b = exported(straight), exported(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after a stop and resume"
    # Every step drew the same trajectories: the same turns, tokens and rewards.
    keys = ("reward_mean", "multi_turn/turns_mean", "multi_turn/policy_token_share", "response_length_mean")
    assert [[r[k] for k in keys] for r in records(straight)] == [[r[k] for k in keys] for r in records(resumed)]
