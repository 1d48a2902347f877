"""A trainer container the kernel kills for its memory ends the RLJob on the real node, not restarted.

The job's actor is given less memory than its rank needs to load (160Mi: the interpreter and torch do
not fit), so the kubelet's cgroup kills the container while it loads, reason OOMKilled, exit 137. The
operator ends the job Failed with the reason OutOfMemory and a message that names the pod, its limit
and the field to change; its backoffLimit would have allowed three gang restarts, and none of them
loads again (a restart JobSet began before the operator saw the kill is stopped with it)."""

from __future__ import annotations

import json
import uuid

import pytest

from .test_cluster_examples import host_claim, kubectl_json, volumes, wait_phase  # noqa: F401  (volumes: a fixture)

pytestmark = pytest.mark.slow
LIMIT = "160Mi"


def test_a_container_killed_for_its_memory_fails_the_job_at_once_naming_it(real_node, operator_release, built_images, volumes) -> None:
    from kuberl.engine.models.tiny import make_tiny_model

    node, ns = real_node, f"oom-{uuid.uuid4().hex[:6]}"
    node.plane.kubectl("create", "namespace", ns)
    files = volumes / ns / "files"
    make_tiny_model(files / "model", seed=0)
    (files / "data").mkdir(parents=True)
    (files / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n" for a in range(8))
    )
    host_claim(node, ns, "rl-files", files, create_claim=True, read_only=True)
    job = {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "small", "namespace": ns},
        "spec": {
            "image": built_images["TRAINER_IMAGE"],
            "imagePullPolicy": "Never",
            "volumes": [{"name": "files", "persistentVolumeClaim": {"claimName": "rl-files", "readOnly": True}}],
            "model": {"path": "/data/model", "dtype": "float32"},
            "data": {"train": {"path": "/data/data/train.jsonl"}, "maxPromptLength": 64},
            "algorithm": {"name": "grpo"},
            "rollout": {"samplesPerPrompt": 2, "maxNewTokens": 4, "kvCacheBytes": 16 << 20},
            "reward": {"rules": [{"name": "math_answer"}]},
            "roles": {
                "actor": {
                    "replicas": 1,
                    "volumeMounts": [{"name": "files", "mountPath": "/data", "readOnly": True}],
                    "resources": {"requests": {"cpu": "100m", "memory": LIMIT}, "limits": {"memory": LIMIT}},
                }
            },
            "trainer": {"totalSteps": 2, "promptsPerStep": 2, "microBatchSize": 2},
            "runPolicy": {"backoffLimit": 3},
            "monitoring": {"enabled": False},
        },
    }
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(job))

    s = wait_phase(node, ns, "small", "Failed", timeout=300)
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "OutOfMemory", s
    assert f"was killed for running out of memory (limit {LIMIT}); not retried" in failed["message"], failed
    assert "roles.actor.resources.limits.memory" in failed["message"], failed
    # One attempt was killed, and that is the only one recorded: no restart loaded the model again.
    [kept] = s["failures"]
    assert (kept["role"], kept["reason"], kept["exitCode"]) == ("actor", "OOMKilled", 137), kept
    assert kept["pod"] in failed["message"]
    assert s.get("restarts", 0) <= 1, s
    events = kubectl_json(node, "get", "events", "-n", ns, "--field-selector", "involvedObject.name=small")["items"]
    assert [e["reason"] for e in events if e["type"] == "Warning"].count("OutOfMemory") == 1, [e["reason"] for e in events]
    node.plane.kubectl("get", "jobset", "small", "-n", ns, check=False)
    node.plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
