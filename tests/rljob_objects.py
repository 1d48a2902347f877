"""An RLJob object as the API server would hand it to the job commands, with the status a test gives it."""

from __future__ import annotations

from kuberl.operator.api import RLJob


def job(**status: object) -> RLJob:
    return RLJob.model_validate(
        {
            "apiVersion": "kuberl.dev/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "demo", "namespace": "rl", "creationTimestamp": "2030-01-01T00:00:00Z"},
            "spec": {
                "model": {"path": "/m"},
                "data": {"train": {"path": "/d.jsonl"}},
                "algorithm": {"name": "grpo"},
                "rollout": {"samplesPerPrompt": 4},
                "reward": {"rules": [{"name": "math_answer"}]},
                "roles": {"actor": {"replicas": 2}},
                "trainer": {"totalSteps": 40},
            },
            **({"status": status} if status else {}),
        }
    )
