"""Generation on ranks of its own (rollout.placement: separate) through `kuberl run`: with maxStaleness 0
it is the colocated run bit for bit; with maxStaleness 1 generation runs one batch ahead, every batch
records its staleness within the bound, and the rollout corrections read the behaviour log-probs."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from kuberl.engine.runtime.metrics import GAUGES

pytestmark = pytest.mark.slow

STEPS = 5
DATA = {
    "train": {"generator": {"name": "arithmetic", "count": 32, "seed": 1, "maxOperand": 9}},
    "validation": {"generator": {"name": "arithmetic", "count": 4, "seed": 2, "maxOperand": 9}},
    "maxPromptLength": 64,
}
SEPARATE = {"rollout": {"replicas": 2, "layout": {"dp": 2}}}


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def run_one_thread(kuberl_cli: str, job: Path, run: Path) -> None:
    # One thread per rank in both runs: the same float sums in every matrix product.
    result = subprocess.run([kuberl_cli, "run", str(job), "--out", str(run), "--threads", "1"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]


def exported(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "final" / "model.safetensors")


ASYNC_GAUGE_KEYS = [
    GAUGES[name][1]
    for name in (
        "kuberl_staleness",
        "kuberl_staleness_mean",
        "kuberl_weight_sync_seconds",
        "kuberl_weight_sync_bytes",
        "kuberl_weight_sync_version",
    )
]


def test_separate_placement_with_max_staleness_0_is_the_colocated_run_bitwise(make_job, kuberl_cli: str) -> None:
    # A KL term to a colocated reference, and greedy validation every 2 steps (asked of the fleet in between).
    common = dict(steps=STEPS, data=DATA, validationInterval=2)
    ref = {"ref": {"colocateWith": "actor"}}
    colocated_job, colocated = make_job("colocated", algorithm={"name": "grpo", "klCoef": 0.05}, roles=ref, **common)
    separate_job, separate = make_job(
        "separate",
        algorithm={"name": "grpo", "klCoef": 0.05, "async": {"maxStaleness": 0}},
        rollout={"placement": "separate"},
        roles={**ref, **SEPARATE},
        **common,
    )
    for job, run in ((colocated_job, colocated), (separate_job, separate)):
        run_one_thread(kuberl_cli, job, run)
    logs = (separate / "logs" / "rank-2.log").read_text()
    assert "role rollout ready on ranks 2..3 (2 vLLM engine(s))" in logs
    a, b = records(colocated), records(separate)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(0, STEPS + 1))  # step 0: validation alone
    keys = (
        "reward_mean",
        "response_length_mean",
        "policy_loss",
        "entropy",
        "grad_norm",
        "kl",
        "rollout/mismatch_kl",
        "validation_reward_mean",
    )
    for left, right in zip(a, b):
        assert [k for k in keys if k in left] == [k for k in keys if k in right]
        for key in (k for k in keys if k in left):
            assert math.isfinite(left[key]) and left[key] == right[key], (left["step"], key, left[key], right[key])
    assert sum("validation_reward_mean" in r for r in b) == 4  # before the first step, after steps 2, 4 and 5
    for right in b[1:]:
        assert right["staleness"] == 0 and right["rollout_version"] == right["step"] - 1
        # Every version moved the whole model in the switch plan's bytes, bucket by bucket.
        assert right["weight_sync_bytes"] == right["weight_sync_model_bytes"] > 0 and right["weight_sync_buckets"] >= 1
        assert right["weight_sync_seconds"] > 0
        # What Prometheus gets: every separate-placement gauge finds its key in the step's record.
        assert all(isinstance(right[key], float) for key in ASYNC_GAUGE_KEYS), {k: right.get(k) for k in ASYNC_GAUGE_KEYS}
    assert not any(key in left for left in a for key in ASYNC_GAUGE_KEYS)  # colocated: none of them
    final_a, final_b = exported(colocated), exported(separate)
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)
    # Every rank, the rollout role's included, wrote its part of the checkpoint.
    assert sorted(p.name for p in (separate / "ckpt" / f"step-{STEPS:08d}").glob("rank-*.pt")) == [f"rank-{r:05d}.pt" for r in range(4)]


def test_lora_on_separate_placement_streams_the_adapter_alone_and_is_the_colocated_run_bitwise(make_job, kuberl_cli: str) -> None:
    lora = {"rank": 4, "alpha": 8}
    common = dict(steps=3, data=DATA, optimizer={"lr": 1e-2}, lora=lora)
    colocated_job, colocated = make_job("colocated", algorithm={"name": "grpo"}, **common)
    separate_job, separate = make_job(
        "separate", algorithm={"name": "grpo", "async": {"maxStaleness": 0}}, rollout={"placement": "separate"}, roles=SEPARATE, **common
    )
    for job, run in ((colocated_job, colocated), (separate_job, separate)):
        run_one_thread(kuberl_cli, job, run)
    a, b = [r for r in records(colocated) if "reward_mean" in r], [r for r in records(separate) if "reward_mean" in r]
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for left, right in zip(a, b):
        for key in ("reward_mean", "response_length_mean", "policy_loss", "grad_norm", "rollout/mismatch_kl"):
            assert left[key] == right[key], (left["step"], key, left[key], right[key])
        # Each version sent the adapter the colocated switch hands its own vLLM, not the model.
        assert right["weight_sync_bytes"] == left["adapter_bytes"] > 0
        assert right["weight_sync_model_bytes"] >= 100 * right["weight_sync_bytes"]
    assert a[-1]["reward_mean"] != a[0]["reward_mean"] or a[-1]["policy_loss"] != a[0]["policy_loss"]  # it trained
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (colocated / "final" / name).read_bytes() == (separate / "final" / name).read_bytes()


@pytest.mark.parametrize("bound", [1, 2])
def test_max_staleness_generates_ahead_within_the_bound_and_corrects_with_behaviour_logprobs(make_job, kuberl_cli: str, bound: int) -> None:
    job, run = make_job(
        "async",
        steps=STEPS,
        rollout={"placement": "separate"},
        roles=SEPARATE,
        algorithm={"name": "grpo", "async": {"maxStaleness": bound}, "oldLogprobs": "recompute", "tis": {"cap": 2.0}},
    )
    run_one_thread(kuberl_cli, job, run)
    steps = records(run)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    # The first batches are generated with the first weights, asked for at once; each later one at the
    # step `bound` before its own, while that step trained: exactly `bound` versions behind.
    expected = [min(step, bound) for step in range(STEPS)]
    assert [r["staleness"] for r in steps] == expected
    assert [r["rollout_version"] for r in steps] == [step - s for step, s in enumerate(expected)]
    assert all(r["staleness"] <= bound for r in steps)
    for r in steps[1:]:
        tokens = {k: v for k, v in r.items() if k.startswith("staleness_tokens/")}
        assert tokens == {f"staleness_tokens/{int(r['staleness'])}": pytest.approx(r["response_length_mean"] * 16)}
        # The behaviour policy (vLLM's log-probs, one version old) against the recomputed current one:
        # the mismatch is the update's, and the truncated importance weights correct for it.
        assert r["rollout/mismatch_kl"] > 0 and math.isfinite(r["tis_weight_mean"])
    assert steps[0]["rollout/mismatch_kl"] < min(r["rollout/mismatch_kl"] for r in steps[1:])
    # The load: batches on their way after each step took its own, the idle shares, each replica's rate.
    assert [r["rollout_queue_depth"] for r in steps] == [min(bound, STEPS - 1 - step) for step in range(STEPS)]
    for r in steps:
        assert 0 <= r["trainer_idle_fraction"] < 1 and 0 <= r["rollout_idle_fraction"] < 1, r
        rates = [r[f"rollout_replica/{replica}/tokens_per_second"] for replica in (0, 1)]
        assert min(rates) > 0 and r["rollout_replica_tokens_per_second_min"] == min(rates)
    # The ranks that train never generated: the actor's log says nothing of vLLM's engine.
    assert "role rollout ready" in (run / "logs" / "rank-2.log").read_text()


def test_a_stopped_async_run_resumes_and_equals_an_uninterrupted_one(make_job, start_training, kuberl_cli: str) -> None:
    import signal

    from kuberl.engine.runtime.checkpoint import complete_steps, load

    steps = 6
    common = dict(
        steps=steps,
        rollout={"placement": "separate"},
        roles=SEPARATE,
        checkpoint_interval=1000,
        algorithm={"name": "grpo", "async": {"maxStaleness": 1}},
    )
    job, run = make_job("stopped", **common)
    whole_job, whole = make_job("whole", **common)
    run_one_thread(kuberl_cli, whole_job, whole)
    proc, _ = start_training(job, run, threads=1)  # step 1 is done; the batch of step 2 is on its way
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped_at = records(run)[-1]["step"]
    assert 1 <= stopped_at < steps
    assert complete_steps(run / "ckpt") == [stopped_at]
    assert len(list((run / "ckpt" / f"step-{stopped_at:08d}").glob("rank-*.pt"))) == 4  # the rollout ranks' parts too
    # The checkpoint waited for the batch on its way and kept it, generated by the version before.
    # (The pipeline counts steps from 0, as the weights' versions do: the next is `stopped_at`.)
    kept = load(run / "ckpt", stopped_at, 0, 4)["in_flight"]
    assert list(kept) == [stopped_at] and len(kept[stopped_at]) == 16
    assert {v for c in kept[stopped_at] for v in c["versions"]} == {stopped_at - 1}
    run_one_thread(kuberl_cli, job, run)
    done, expected = records(run), records(whole)
    assert [r["step"] for r in done] == list(range(1, steps + 1))  # nothing lost, nothing done twice
    # The resumed run trains on the kept batch, then asks one ahead again with the same weights at the same
    # steps: step for step what the uninterrupted run did, to the last bit.
    keys = ("staleness", "rollout_version", "reward_mean", "response_length_mean", "policy_loss", "entropy", "grad_norm")
    for left, right in zip(done, expected):
        for key in keys:
            assert left[key] == right[key], (left["step"], key, left[key], right[key])
    final, uninterrupted = exported(run), exported(whole)
    assert final.keys() == uninterrupted.keys() and all(torch.equal(final[k], uninterrupted[k]) for k in final)


def test_a_killed_rollout_rank_ends_the_run_with_its_name(make_job, start_training) -> None:
    import os
    import signal

    job, run = make_job(
        "killed", steps=50, rollout={"placement": "separate"}, roles=SEPARATE, algorithm={"name": "grpo", "async": {"maxStaleness": 1}}
    )
    proc, pids = start_training(job, run)
    try:
        os.kill(pids["3"], signal.SIGKILL)  # the second rollout engine, mid-run
        _, err = proc.communicate(timeout=120)  # no hang: the link fails on the controller's thread and ends the run
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "rank 3 (role rollout) exited with code -9" in err
