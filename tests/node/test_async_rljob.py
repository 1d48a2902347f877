"""Asynchronous RL on the real node: rollout.placement: separate, one actor pod that trains and one rollout
pod that generates with vLLM one batch ahead (algorithm.async.maxStaleness 1), the weights streamed from the
actor's pod to the rollout pod over gloo across the pod network after every update."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from .test_rljob import JobVolume, kubectl_json, rljob

pytestmark = pytest.mark.slow
STEPS = 4


def async_rljob(name: str, claim: str, image: str) -> dict:
    """test_rljob's job with one actor pod and one rollout pod of its own, one version ahead."""
    job = rljob(name, claim, image, steps=STEPS)
    spec = job["spec"]
    spec["algorithm"] = {"name": "grpo", "async": {"maxStaleness": 1}}
    spec["rollout"]["placement"] = "separate"
    spec["reward"] = {"rules": [{"name": "math_answer"}]}
    # The rollout pod reads the model from the checkpoint claim, which every pod of the job mounts.
    spec["roles"] = {"actor": {"replicas": 1}, "rollout": {"replicas": 1}}
    spec["trainer"]["checkpoint"]["interval"] = 2
    spec["runPolicy"] = {"backoffLimit": 1}
    spec["monitoring"] = {"enabled": False}
    return job


@pytest.fixture(scope="module")
def async_volumes(real_node) -> Path:
    root = real_node.workdir / "async-volumes"
    root.mkdir(exist_ok=True)
    return root


def test_a_separate_placement_job_trains_one_version_behind_on_the_real_node(
    real_node, operator_release, built_images, async_volumes: Path
) -> None:
    from kuberl.operator.testing.waiting import eventually

    namespace = f"async-{uuid.uuid4().hex[:6]}"
    real_node.plane.kubectl("create", "namespace", namespace)
    volume = JobVolume(real_node, namespace, async_volumes)
    real_node.plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(async_rljob("fleet", volume.claim, built_images["TRAINER_IMAGE"]))
    )

    def finished() -> dict | None:
        status = kubectl_json(real_node, "get", "rlj", "fleet", "-n", namespace).get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    def rollout_pods() -> list[dict]:
        return kubectl_json(real_node, "get", "pods", "-n", namespace, "-l", "kuberl.dev/role=rollout")["items"]

    try:
        seen = eventually(rollout_pods, 300, "the rollout pod")
        env = {e["name"]: e.get("value") for e in seen[0]["spec"]["containers"][0]["env"]}
        assert (env["KUBERL_ROLE"], env["KUBERL_ROLE_RANK_OFFSET"], env["WORLD_SIZE"]) == ("rollout", "1", "2")
        status = eventually(finished, 900, "the async job to finish")
        logs = ""
        if status["phase"] != "Succeeded":
            for pod in kubectl_json(real_node, "get", "pods", "-n", namespace)["items"]:
                name = pod["metadata"]["name"]
                logs += f"--- {name}\n" + real_node.plane.kubectl("logs", name, "-n", namespace, "--tail=40", check=False).stdout
        assert status["phase"] == "Succeeded", json.dumps(status, indent=1)[-3000:] + logs
        # The actor's success ends the job; the controller stopped the fleet before it. A restart says why.
        assert status["restarts"] == 0, json.dumps({k: status.get(k) for k in ("failures", "conditions")}, indent=1)[-3000:]
        steps = [r for r in volume.records() if "reward_mean" in r]
        assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
        # The bound held: no batch's oldest token more than one version behind, and after the first step every
        # batch generated during the update before it, exactly one version behind.
        assert all(r["staleness"] <= 1 for r in steps), [r["staleness"] for r in steps]
        assert [r["staleness"] for r in steps[1:]] == [1] * (STEPS - 1)
        # The new versions reached the rollout pod, whole models over the pod network (the first three: batches
        # 1 and 2 with version 0, 3 with 1, 4 with 2; how many a step's record counts depends on when each ended).
        model_bytes = max(r.get("weight_sync_model_bytes", 0) for r in steps)
        assert sum(r.get("weight_sync_bytes", 0) for r in steps) >= 2 * model_bytes > 0
        assert (volume.host / "final" / "model.safetensors").is_file()
    finally:
        real_node.plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
