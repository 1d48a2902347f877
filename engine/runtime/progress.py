"""The controller rank's progress report to the operator: progress.json in the job's progress ConfigMap.

The report is kuberl.engine.config.ProgressReport, the model the operator parses (the contract lives
there, on neither side). Outside a cluster it does nothing.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from typing import Any, Mapping, Sequence

from ..config.progress import PROGRESS_KEY, CheckpointStatus, ProgressReport

log = logging.getLogger("kuberl.engine")


# The ETA is the mean time of the last ETA_WINDOW steps times the steps left; before ETA_MIN_STEPS steps have
# been timed since the ranks started (the first steps after a start or a restart include warm-up) it is unknown.
ETA_MIN_STEPS = 3
ETA_WINDOW = 10


def eta_seconds(step_seconds: Sequence[float], steps_left: int, min_steps: int = ETA_MIN_STEPS, window: int = ETA_WINDOW) -> float | None:
    """Seconds until the last step: the mean of the last `window` step times, times `steps_left`.

    0 when no step is left; None ("unknown") while fewer than `min_steps` step times are known.
    """
    if steps_left <= 0:
        return 0.0
    recent = [s for s in step_seconds if math.isfinite(s) and s >= 0][-window:]
    if len(recent) < min_steps:
        return None
    return sum(recent) / len(recent) * steps_left


def progress_report(
    record: Mapping[str, Any],
    total_steps: int,
    last_checkpoint: CheckpointStatus | None,
    *,
    eta: float | None = None,
    validation: tuple[int, float] | None = None,
) -> ProgressReport:
    """The report of one step's metrics record; non-finite numbers are left out (JSON cannot carry them).
    `eta`: seconds until the last step (eta_seconds); `validation`: the latest (step, validation reward mean)."""

    def finite(key: str) -> float | None:
        value = record.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    def fraction(key: str) -> float | None:
        value = finite(key)
        return value if value is not None and 0 <= value <= 1 else None

    tokens = finite("rollout_tokens_per_second")
    staleness = finite("staleness")
    return ProgressReport(
        step=int(record.get("step", 0)),
        total_steps=total_steps,
        reward_mean=finite("reward_mean"),
        kl=finite("kl"),
        tokens_per_second=tokens if tokens is None or tokens >= 0 else None,
        last_checkpoint=last_checkpoint,
        eta_seconds=eta if eta is not None and math.isfinite(eta) else None,
        validation_step=validation[0] if validation else None,
        validation_reward_mean=validation[1] if validation else None,
        staleness=int(staleness) if staleness is not None and staleness >= 0 else None,
        trainer_idle_fraction=fraction("trainer_idle_fraction"),
        rollout_idle_fraction=fraction("rollout_idle_fraction"),
    )


class ProgressTracker:
    """What a report needs beyond one step's record: the recent step times (for the ETA) and the latest validation."""

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self.step_seconds: deque[float] = deque(maxlen=ETA_WINDOW)
        self.validation: tuple[int, float] | None = None

    def report(self, record: Mapping[str, Any], last_checkpoint: CheckpointStatus | None) -> ProgressReport:
        step = int(record.get("step", 0))
        seconds = record.get("step_seconds")
        if isinstance(seconds, (int, float)) and math.isfinite(seconds):
            self.step_seconds.append(float(seconds))
        value = record.get("validation_reward_mean")
        if isinstance(value, (int, float)) and math.isfinite(value):
            self.validation = (step, float(value))
        return progress_report(
            record,
            self.total_steps,
            last_checkpoint,
            eta=eta_seconds(self.step_seconds, self.total_steps - step),
            validation=self.validation,
        )


class ProgressWriter:
    """Patches the ConfigMap named by KUBERL_PROGRESS_CONFIGMAP in POD_NAMESPACE, with the pod's own ServiceAccount."""

    def __init__(self, environ: Mapping[str, str] = os.environ):
        self.name = environ.get("KUBERL_PROGRESS_CONFIGMAP")
        self.namespace = environ.get("POD_NAMESPACE")
        self.api = None
        if self.name and self.namespace and environ.get("KUBERNETES_SERVICE_HOST"):
            from kubernetes import client, config

            config.load_incluster_config()
            self.api = client.CoreV1Api()

    def write(self, report: ProgressReport) -> None:
        if self.api is None:
            return
        try:
            self.api.patch_namespaced_config_map(self.name, self.namespace, {"data": {PROGRESS_KEY: report.to_json()}})
        except Exception as exc:  # progress is informational: a failed write must not stop training
            log.warning("could not write progress to ConfigMap %s/%s: %s", self.namespace, self.name, exc)
