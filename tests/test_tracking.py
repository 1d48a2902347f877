"""Experiment tracking with the real libraries: TensorBoard, MLflow (a local file store) and W&B
(offline), each fed steps, an artifact, and a resumed attempt that must continue the same run."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from kuberl.engine.config.tracking import TrackingSpec
from kuberl.engine.tracking import RUN_IDS_FILE, Trackers, TrackingError, check_available, flat_params, tracked_scalars
from kuberl.operator.testing.tracking_files import tensorboard_scalars, wandb_runs
from kuberl.operator.cli.ports import free_port


def record(step: int) -> dict:
    return {
        "step": step,
        "reward_mean": 0.1 * step,
        "policy_loss": -0.01 * step,
        "critic/value_loss": 1.0,
        "phase_seconds": {"rollout": 2.0},
        "checkpoint": "/x",
        "rollout_tokens_per_second": 50.0,
    }


def test_scalars_keep_their_names_under_verl_groups():
    assert tracked_scalars(record(2)) == {
        "reward/reward_mean": pytest.approx(0.2),
        "actor/policy_loss": pytest.approx(-0.02),
        "critic/value_loss": 1.0,
        "timing/rollout": 2.0,
        "perf/rollout_tokens_per_second": 50.0,
    }
    assert flat_params({"algorithm": {"name": "grpo"}, "tracking": [{"backend": "wandb"}]}) == {
        "algorithm.name": "grpo",
        "tracking.0.backend": "wandb",
    }


def _png(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (8, 4), (200, 10, 10)).save(path)
    return path


def _two_attempts(tmp_path: Path, spec: TrackingSpec) -> None:
    """Steps 1-2, the reward curve, then a resumed attempt (from step 2's checkpoint) that logs step 3."""
    params = {"algorithm.name": "grpo", "job": "tracked"}
    first = Trackers([spec], job="tracked", run_dir=tmp_path, ids_dir=tmp_path / "ckpt", params=params, resumed_at=0)
    assert list(first.active) == [spec.backend]
    for step in (1, 2):
        first.log(record(step))
    first.artifact(_png(tmp_path / "reward_curve.png"))
    first.close()
    second = Trackers([spec], job="tracked", run_dir=tmp_path, ids_dir=tmp_path / "ckpt", params=params, resumed_at=2)
    second.log(record(3))
    second.close()


def test_tensorboard_event_files_read_back_and_resume_appends(tmp_path: Path) -> None:
    _two_attempts(tmp_path, TrackingSpec(backend="tensorboard"))
    assert tensorboard_scalars(tmp_path / "tensorboard", "reward/reward_mean") == [
        (1, pytest.approx(0.1)),
        (2, pytest.approx(0.2)),
        (3, pytest.approx(0.3)),
    ]


def test_tensorboard_resume_drops_steps_after_the_checkpoint(tmp_path: Path) -> None:
    # An attempt that crashed after step 3 without a checkpoint of it: the next attempt resumes at 2.
    spec = TrackingSpec(backend="tensorboard")
    crashed = Trackers([spec], job="t", run_dir=tmp_path, ids_dir=tmp_path, params={}, resumed_at=0)
    for step in (1, 2, 3):
        crashed.log({"step": step, "reward_mean": 1.0})
    crashed.close()
    resumed = Trackers([spec], job="t", run_dir=tmp_path, ids_dir=tmp_path, params={}, resumed_at=2)
    resumed.log({"step": 3, "reward_mean": 9.0})
    resumed.close()
    assert tensorboard_scalars(tmp_path / "tensorboard", "reward/reward_mean") == [(1, 1.0), (2, 1.0), (3, 9.0)]


def test_mlflow_file_store_reads_back_through_mlflowclient_and_resume_continues_the_run(tmp_path: Path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this test's reader; the tracker sets it for a file: URI
    uri = f"file:{tmp_path / 'mlruns'}"
    _two_attempts(tmp_path, TrackingSpec(backend="mlflow", tracking_uri=uri, experiment="kuberl-tests"))
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("kuberl-tests").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/reward_mean")] == [
        (1, pytest.approx(0.1)),
        (2, pytest.approx(0.2)),
        (3, pytest.approx(0.3)),
    ]
    assert run.data.params["algorithm.name"] == "grpo" and run.info.run_name == "tracked"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["reward_curve.png"]
    assert run.info.status == "FINISHED"


def test_wandb_offline_run_folder_holds_the_metrics_and_resume_keeps_the_run_id(tmp_path: Path) -> None:
    _two_attempts(tmp_path, TrackingSpec(backend="wandb", project="kuberl-tests", mode="offline"))
    runs = wandb_runs(tmp_path / "wandb")
    assert len(runs) == 2 and runs[0]["id"] == runs[1]["id"]  # W&B merges both folders into one run on sync
    steps = [(row["_step"], row["reward/reward_mean"]) for run in runs for row in run["history"]]
    assert steps == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, pytest.approx(0.3))]
    assert "algorithm.name" in runs[0]["config"]
    assert (runs[0]["folder"] / "files" / "reward_curve.png").exists()


def test_a_backend_that_fails_warns_once_and_the_others_go_on(tmp_path: Path, caplog, monkeypatch) -> None:
    port = free_port()  # nobody listens on it: the MLflow server is down
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    specs = [TrackingSpec(backend="mlflow", tracking_uri=f"http://127.0.0.1:{port}"), TrackingSpec(backend="tensorboard")]
    with caplog.at_level(logging.WARNING, logger="kuberl.engine"):
        trackers = Trackers(specs, job="t", run_dir=tmp_path, ids_dir=tmp_path, params={}, resumed_at=0)
        for step in (1, 2):
            trackers.log({"step": step, "reward_mean": 0.5})
        trackers.close()
    warnings = [r.getMessage() for r in caplog.records if "tracking: mlflow failed" in r.getMessage()]
    assert len(warnings) == 1 and "training goes on without it" in warnings[0]
    assert list(tensorboard_scalars(tmp_path / "tensorboard", "reward/reward_mean")) == [(1, 0.5), (2, 0.5)]


def test_a_backend_whose_package_is_missing_is_refused_with_its_extra_simulated(monkeypatch) -> None:
    # The package is installed here; a None in sys.modules is how Python marks one as unimportable.
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(
        TrackingError,
        match=r"monitoring.tracking\[1\].backend: wandb needs the wandb package, "
        r"which is not installed: pip install 'kuberl\[wandb\]'",
    ):
        check_available([TrackingSpec(backend="tensorboard"), TrackingSpec(backend="wandb", project="p")])


def test_run_ids_are_kept_beside_the_checkpoints(tmp_path: Path) -> None:
    import json

    trackers = Trackers(
        [TrackingSpec(backend="tensorboard")], job="t", run_dir=tmp_path, ids_dir=tmp_path / "ckpt", params={}, resumed_at=0
    )
    trackers.close()
    assert json.loads((tmp_path / "ckpt" / RUN_IDS_FILE).read_text()) == {"tensorboard": str(tmp_path / "tensorboard")}
