"""The controller rank's progress report to the operator: progress.json in the job's progress ConfigMap.

The keys are those of the operator's ProgressReport model (the engine never imports the
operator; a test checks that the operator parses what this writes). Outside a cluster it does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping

log = logging.getLogger("kuberl.engine")
KEY = "progress.json"


def progress_json(record: Mapping[str, Any], total_steps: int) -> str:
    def finite(value: Any) -> float | None:
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    report: dict[str, Any] = {"step": int(record.get("step", 0)), "totalSteps": total_steps}
    for key, name in (("reward_mean", "rewardMean"), ("kl", "kl"), ("rollout_tokens_per_second", "tokensPerSecond")):
        value = finite(record.get(key))
        if value is not None:
            report[name] = value
    return json.dumps(report, sort_keys=True)


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

    def write(self, record: Mapping[str, Any], total_steps: int) -> None:
        if self.api is None:
            return
        try:
            self.api.patch_namespaced_config_map(self.name, self.namespace, {"data": {KEY: progress_json(record, total_steps)}})
        except Exception as exc:  # progress is informational: a failed write must not stop training
            log.warning("could not write progress to ConfigMap %s/%s: %s", self.namespace, self.name, exc)
