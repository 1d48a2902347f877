"""A LoRA RLJob on the real node: two actor pods (DP=2 over the pod network) train an adapter on the
frozen tiny model, the reference is the base with the adapter off (on the actor's pods), vLLM in
each pod samples with the adapter it is handed at every switch, and the job leaves a PEFT adapter
folder, checkpoints of the adapter alone and the merged model."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from .test_rljob import DATA, JobVolume, kubectl_json, rljob

pytestmark = pytest.mark.slow
STEPS = 4


def lora_rljob(name: str, claim: str, image: str) -> dict:
    """test_rljob's job training a LoRA adapter, with the reference on the actor's pods (the adapter off)."""
    job = rljob(name, claim, image, steps=STEPS)
    spec = job["spec"]
    spec["reward"] = {"rules": [{"name": "math_answer"}]}
    spec["roles"]["ref"] = {"colocateWith": "actor"}
    spec["trainer"]["optimizer"]["lr"] = 1e-3
    spec["trainer"]["checkpoint"]["interval"] = 2
    spec["trainer"]["lora"] = {"rank": 4, "alpha": 8, "mergedExportPath": f"{DATA}/merged"}
    spec["runPolicy"] = {"backoffLimit": 1}
    spec["monitoring"] = {"enabled": False}
    return job


def test_lora_rljob_trains_and_exports_an_adapter_on_the_real_node(real_node, operator_release, built_images, lora_volumes: Path) -> None:
    from kuberl.operator.testing.waiting import eventually

    namespace = f"lora-{uuid.uuid4().hex[:6]}"
    real_node.plane.kubectl("create", "namespace", namespace)
    volume = JobVolume(real_node, namespace, lora_volumes)
    real_node.plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(lora_rljob("lora", volume.claim, built_images["TRAINER_IMAGE"]))
    )

    def phase() -> str | None:
        status = kubectl_json(real_node, "get", "rlj", "lora", "-n", namespace).get("status") or {}
        return status.get("phase") if status.get("phase") in ("Succeeded", "Failed") else None

    try:
        assert eventually(phase, 900, "the LoRA job to finish") == "Succeeded"
        steps = [r for r in volume.records() if "reward_mean" in r]
        assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
        # The switch hands vLLM the adapter alone (this tiny model's adapter is a twentieth of its weights).
        assert all(0 < r["adapter_bytes"] == r["switch_bytes"] < r["switch_full_bytes"] / 10 for r in steps)
        config = json.loads((volume.host / "final" / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA" and config["r"] == 4
        assert (volume.host / "final" / "adapter_model.safetensors").is_file()
        assert (volume.host / "merged" / "model.safetensors").is_file()
        checkpoint = sorted(volume.host.glob("step-*"))[-1]
        assert json.loads((checkpoint / "meta.json").read_text())["base_model"]["path"] == f"{DATA}/model"
    finally:
        real_node.plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
