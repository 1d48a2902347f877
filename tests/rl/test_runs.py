"""Whole jobs through `kuberl run` on a tiny random model: several gloo ranks, real Megatron, real vLLM."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def finite(record: dict, *keys: str) -> None:
    for key in keys:
        assert key in record and math.isfinite(record[key]), (key, record.get(key))


def exported(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "final" / "model.safetensors")


def test_grpo_two_steps_dp2_with_reference(make_job, run_job, tiny_model: Path) -> None:
    job, run = make_job(
        algorithm={"name": "grpo", "klCoef": 0.05},
        roles={"ref": {"colocateWith": "actor"}},
        validationInterval=2,
        data={
            "train": {"generator": {"name": "arithmetic", "count": 32, "seed": 1, "maxOperand": 9}},
            "validation": {"generator": {"name": "arithmetic", "count": 4, "seed": 2, "maxOperand": 9}},
            "maxPromptLength": 64,
        },
    )
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "every rank finished" in result.stderr
    steps = [r for r in records(run) if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        finite(
            r,
            "reward_mean",
            "policy_loss",
            "kl",
            "entropy",
            "grad_norm",
            "reshard_seconds",
            "rollout_tokens_per_second",
            "response_length_mean",
            "train_tokens_per_second",
        )
        # Packed runs in which a prompt's 4 samples share one copy of it: fewer positions than tokens.
        assert 0.2 < r["train_positions_per_token"] < 1
        assert r["reshard_bytes"] == 0  # dp=2: each rank holds the whole model, nothing to gather
    assert "validation_reward_mean" in steps[-1]
    assert (run / "reward_curve.png").stat().st_size > 1000
    # The policy moved, and the export loads in transformers.
    import transformers
    from safetensors.torch import load_file

    start = load_file(tiny_model / "model.safetensors")
    final = exported(run)
    assert not torch.equal(start["model.embed_tokens.weight"], final["model.embed_tokens.weight"])
    model = transformers.AutoModelForCausalLM.from_pretrained(run / "final")
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_ppo_with_critic_tp2(make_job, run_job) -> None:
    job, run = make_job(
        algorithm={"name": "ppo", "ppo": {"gae": {"gamma": 1.0, "lambda": 0.95}}},
        layout={"tp": 2},
        roles={"critic": {"colocateWith": "actor"}},
        samples=2,
    )
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in records(run) if "reward_mean" in r]
    assert len(steps) == 2
    for r in steps:
        finite(r, "policy_loss", "critic/value_loss", "critic/grad_norm", "entropy")
    # tp=2: each rank gathered the other half of every split weight through the switch.
    assert steps[0]["reshard_bytes"] > 0


def test_grpo_tp2_generates_with_vllm_replicas_of_two_ranks(make_job, run_job, tiny_model: Path) -> None:
    # rolloutTp = tp = 2: the two ranks form one tensor-parallel vLLM replica, and each rank's
    # training shard is its generation shard, so the switch moves nothing. A high learning rate
    # makes stale rollout weights show at once. At temperature 0.7 the trainer's log-probs are the
    # tempered policy's, and so are vLLM's (processed, not raw, log-probs).
    job, run = make_job(layout={"tp": 2, "rolloutTp": 2}, optimizer={"lr": 1e-2}, rollout={"temperature": 0.7})
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in records(run) if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["reshard_bytes"] == 0
        # The rollout's log-probabilities are the actor's own before its update: vLLM generated with
        # the current weights, each rank holding half of them.
        assert abs(r["approx_kl"]) < 1e-4, r
        assert r["rollout/mismatch_max"] < 1e-3, r
    from safetensors.torch import load_file

    start, final = load_file(tiny_model / "model.safetensors"), exported(run)
    assert not torch.equal(start["model.embed_tokens.weight"], final["model.embed_tokens.weight"])
    # The export gathers the whole model (a switch with rolloutTp 1) on both ranks.
    assert set(final) >= {"model.embed_tokens.weight", "model.layers.0.mlp.gate_proj.weight"}
    assert final["model.layers.0.mlp.gate_proj.weight"].shape == start["model.layers.0.mlp.gate_proj.weight"].shape


def test_dpo_step(make_job, run_job, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"prompt": f"What is {a} + 1?", "chosen": str(a + 1), "rejected": str(a + 7)}) + "\n" for a in range(4))
    )  # every step sees the same 4 pairs
    job, run = make_job(
        algorithm={"name": "dpo", "dpo": {"beta": 0.1}},
        roles={"ref": {"colocateWith": "actor"}},
        data={"train": {"path": str(pairs)}, "maxPromptLength": 64, "chosenField": "chosen", "rejectedField": "rejected"},
        steps=2,
        microBatchSize=2,
    )
    result = run_job(job, run)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = records(run)
    assert len(steps) == 2
    for r in steps:
        finite(r, "dpo_loss", "reward_margin", "grad_norm")
    # The first step starts at the reference: loss log(2), margin 0.
    assert steps[0]["dpo_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert steps[1]["reward_margin"] > 0  # step 1's update moved the policy toward the chosen answers


STOP_STEPS = 12


def test_sigterm_checkpoints_the_running_step_and_resume_is_exact_pp2(make_job, run_job, start_training) -> None:
    from kuberl.engine.runtime.checkpoint import complete_steps

    # Enough steps that the signal lands before the end: a step of the tiny model can take well
    # under a second, and the run is seen under way only after its first step.
    straight_job, straight = make_job("straight", steps=STOP_STEPS, layout={"pp": 2})
    result = run_job(straight_job, straight)
    assert result.returncode == 0, result.stderr[-3000:]
    # No periodic checkpoint: the only one is what the signal asks for.
    job, resumed = make_job("resumed", steps=STOP_STEPS, layout={"pp": 2}, checkpoint_interval=1000)
    proc, _ = start_training(job, resumed)  # step 1 is done
    try:
        proc.send_signal(signal.SIGTERM)  # what the kubelet sends a pod that is deleted, evicted or drained
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped_at = records(resumed)[-1]["step"]
    assert 1 <= stopped_at < STOP_STEPS, "the run should have stopped early"
    assert complete_steps(resumed / "ckpt") == [stopped_at]  # the step that was running, checkpointed
    assert f"stopped after step {stopped_at} on request" in (resumed / "logs" / "rank-0.log").read_text()

    result = run_job(job, resumed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"(step {stopped_at})" in (resumed / "logs" / "rank-0.log").read_text()  # "resumed from ... (step k)"
    steps = [r["step"] for r in records(resumed)]
    assert steps == list(range(1, STOP_STEPS + 1)), steps  # nothing lost, nothing done twice
    a, b = exported(straight), exported(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after a stop and resume"
    assert records(straight)[-1]["reward_mean"] == records(resumed)[-1]["reward_mean"]


def test_killed_rank_ends_the_run_with_its_name(make_job, start_training) -> None:
    job, run = make_job(steps=50)
    proc, pids = start_training(job, run)
    try:
        os.kill(pids["1"], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)  # no hang: the run ends well within this
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "rank 1 (role actor) exited with code -9" in err


def test_bad_data_line_names_file_and_line(make_job, run_job, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n{"prompt": "What is 2 + 2?", "answer": 4\n')
    job, run = make_job(data={"train": {"path": str(data)}, "maxPromptLength": 64})
    result = run_job(job, run)
    assert result.returncode == 1
    assert f"{data}:2: not valid JSON" in result.stderr


def test_ctrl_c_stops_every_rank_even_when_sigint_was_ignored(make_job, start_training) -> None:
    from kuberl.engine.runtime.checkpoint import complete_steps

    job, run = make_job(steps=50, checkpoint_interval=1000)
    # A shell that starts a job in the background hands it SIGINT ignored (so do many CI runners);
    # `kuberl run` must stop on Ctrl-C whatever it inherited.
    proc, pids = start_training(job, run, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends (here to `kuberl run` alone)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; stopping every rank" in err
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert complete_steps(run / "ckpt") == [records(run)[-1]["step"]]


def test_smoke(kuberl_cli: str) -> None:
    import subprocess

    result = subprocess.run([kuberl_cli, "smoke"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "training layout : TP=2 PP=1 DP=1" in result.stdout
    assert "kuberl smoke: OK, everything worked." in result.stdout


FAKE_KEYS = {"WANDB_API_KEY": "kuberl-planted-wandb-key-7f3a9c", "MLFLOW_TRACKING_TOKEN": "kuberl-planted-mlflow-token-51be"}


def test_plugin_job_tracks_to_three_backends_and_a_resumed_run_continues_them(
    make_job, run_job, tiny_model: Path, tmp_path: Path, monkeypatch
) -> None:
    # The example plug-in's estimator (registered from a file at start, on every rank) with GSPO's
    # sequence-level clipping (wide clip range, so that the tiny model's first steps move it), and
    # every step to TensorBoard, MLflow (a file store) and W&B (offline). One step, then `kuberl run`
    # again with two: the second attempt resumes from step 1's checkpoint into the same runs.
    from mlflow.tracking import MlflowClient

    from kuberl.operator.testing.tracking_files import tensorboard_scalars, wandb_runs

    for name, value in FAKE_KEYS.items():  # what a Secret would put in the pod's environment
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this test's reader; the engine sets it for a file: URI
    plugin = Path(__file__).parents[2] / "examples" / "plugins" / "median_baseline.py"
    mlruns = f"file:{tmp_path / 'mlruns'}"
    kwargs = dict(
        algorithm={
            "name": "grpo",
            "plugins": [{"path": str(plugin)}],
            "advantage": {"name": "median_baseline", "options": {"scale": 2.0}},
            "policyLoss": {"name": "gspo", "options": {"clipLow": 0.2, "clipHigh": 0.28}},
        },
        optimizer={"lr": 1e-3},
    )
    tracking = [
        {"backend": "tensorboard"},
        {"backend": "mlflow", "trackingUri": mlruns, "experiment": "plugin-job"},
        {"backend": "wandb", "project": "kuberl-tests", "mode": "offline"},
    ]
    outputs = []
    for steps in (1, 2):
        job, run = make_job(steps=steps, **kwargs)
        spec = yaml.safe_load(job.read_text())
        spec["spec"]["monitoring"] = {"enabled": False, "tracking": tracking}
        job.write_text(yaml.safe_dump(spec))
        result = run_job(job, run)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout + result.stderr)
    assert "resumed from" in outputs[1]
    steps = [r for r in records(run) if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        finite(r, "policy_loss", "grad_norm", "approx_kl", "clip_fraction")
    from safetensors.torch import load_file

    start, final = load_file(tiny_model / "model.safetensors"), exported(run)
    assert not torch.equal(start["model.embed_tokens.weight"], final["model.embed_tokens.weight"])

    # Each backend holds steps 1 and 2 in one run, with the values of metrics.jsonl.
    rewards = [(r["step"], pytest.approx(r["reward_mean"])) for r in steps]
    assert tensorboard_scalars(run / "tensorboard", "reward/reward_mean") == rewards
    assert [s for s, _ in tensorboard_scalars(run / "tensorboard", "actor/policy_loss")] == [1, 2]
    client = MlflowClient(tracking_uri=mlruns)
    [mlrun] = client.search_runs([client.get_experiment_by_name("plugin-job").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, "reward/reward_mean")] == rewards
    assert mlrun.data.params["algorithm.advantage.name"] == "median_baseline"
    assert "reward_curve.png" in [a.path for a in client.list_artifacts(mlrun.info.run_id)]
    attempts = wandb_runs(run / "wandb")
    assert len(attempts) == 2 and attempts[0]["id"] == attempts[1]["id"]
    assert [
        (row["_step"], pytest.approx(row["reward/reward_mean"])) for a in attempts for row in a["history"] if "reward/reward_mean" in row
    ] == rewards

    # The planted credentials appear in no output, log, metric or tracker file.
    leaks = [
        str(p)
        for p in [*run.rglob("*"), *(tmp_path / "mlruns").rglob("*")]
        if p.is_file() and any(v.encode() in p.read_bytes() for v in FAKE_KEYS.values())
    ]
    assert not leaks and not any(v in out for v in FAKE_KEYS.values() for out in outputs)
