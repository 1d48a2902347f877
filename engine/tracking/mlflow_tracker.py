"""MLflow: a run in an experiment of a tracking server or a local store, through MlflowClient (no global run)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..config.tracking import TrackingSpec
from .registry import TrackerContext, register_tracker

# MLflow's limits: 100 parameters and 1000 metrics per batch, parameter values up to 6000 characters.
_PARAMS_PER_BATCH, _METRICS_PER_BATCH, _PARAM_CHARS = 100, 1000, 6000


class MLflowTracker:
    def __init__(self, spec: TrackingSpec, ctx: TrackerContext):
        assert spec.tracking_uri is not None
        if spec.tracking_uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance mode behind this switch; the job asked for it.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        self.client = MlflowClient(tracking_uri=spec.tracking_uri)
        if ctx.run_id is not None:
            self.run_id = self.client.get_run(ctx.run_id).info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = spec.experiment or ctx.job
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=ctx.job, tags={"kuberl.job": ctx.job}).info.run_id
        params = [Param(k, v[:_PARAM_CHARS]) for k, v in sorted(ctx.params.items())]
        for start in range(0, len(params), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + _PARAMS_PER_BATCH])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(name, value, now, step) for name, value in scalars.items()]
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _METRICS_PER_BATCH])

    def artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@register_tracker("mlflow", module="mlflow", extra="mlflow")
def open_mlflow(spec: TrackingSpec, ctx: TrackerContext) -> MLflowTracker:
    return MLflowTracker(spec, ctx)
