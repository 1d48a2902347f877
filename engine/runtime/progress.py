"""The controller rank's progress report to the operator: progress.json in the job's progress ConfigMap.

The report is kuberl.engine.config.ProgressReport, the model the operator parses (the contract lives
there, on neither side). Outside a cluster it does nothing.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Mapping

from ..config.progress import PROGRESS_KEY, CheckpointStatus, ProgressReport

log = logging.getLogger("kuberl.engine")


def progress_report(record: Mapping[str, Any], total_steps: int, last_checkpoint: CheckpointStatus | None) -> ProgressReport:
    """The report of one step's metrics record; non-finite numbers are left out (JSON cannot carry them)."""
    def finite(key: str) -> float | None:
        value = record.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    tokens = finite("rollout_tokens_per_second")
    return ProgressReport(step=int(record.get("step", 0)), total_steps=total_steps, reward_mean=finite("reward_mean"),
                          kl=finite("kl"), tokens_per_second=tokens if tokens is None or tokens >= 0 else None,
                          last_checkpoint=last_checkpoint)


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
