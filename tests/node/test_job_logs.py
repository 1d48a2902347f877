"""The job commands on a real node, where pods have logs: `kuberl logs -f` streams rank 0's lines while it trains and
ends with its pod, `--rank` and `--role` pick the pods' logs, and the finished job's status says 100%.
(Every other command and client call: tests/cluster/test_client.py on the test control plane, whose kwok pods
have no logs.) examples/client_quickstart.py runs on the same job. A tiny job of 3 steps on two actor pods (ranks 0 and 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from .test_rljob import JobVolume

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent.parent
STEPS = 3


def tiny_job(name: str, image: str, claim: str) -> dict:
    return {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "imagePullPolicy": "Never",
            "model": {"path": "/data/model", "dtype": "float32"},
            "data": {"train": {"generator": {"name": "arithmetic", "count": 16, "seed": 1, "maxOperand": 9}}, "maxPromptLength": 64},
            "algorithm": {"name": "grpo"},
            "rollout": {"samplesPerPrompt": 4, "maxNewTokens": 6, "kvCacheBytes": 64 << 20},
            "reward": {"rules": [{"name": "math_answer"}]},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            "roles": {"actor": {"replicas": 2, "layout": {"dp": 2}, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}},
            "trainer": {
                "totalSteps": STEPS,
                "promptsPerStep": 4,
                "microBatchSize": 4,
                "seed": 3,
                "checkpoint": {"path": "/data/checkpoints", "interval": STEPS},
            },
            "runPolicy": {"backoffLimit": 0},
        },
    }


def kuberl(node, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "kuberl"), *args, "--kubeconfig", str(node.plane.kubeconfig)], capture_output=True, text=True, timeout=timeout
    )


def test_logs_follow_a_real_pod_and_pick_ranks_and_roles(real_node, operator_release, built_images, tmp_path) -> None:
    from kuberl.client import RLJobClient

    node, ns, name = real_node, f"logs-{uuid.uuid4().hex[:6]}", "chatty"
    node.plane.kubectl("create", "namespace", ns)
    # The tiny model on a claim bound to a hostPath volume an admin made (a job's own hostPath is refused).
    volume = JobVolume(node, ns, node.workdir / "job-commands")
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(tiny_job(name, built_images["TRAINER_IMAGE"], volume.claim)))

    submitted = kuberl(node, "submit", str(manifest), "-n", ns)
    assert (submitted.returncode, submitted.stdout) == (0, f"{name}\n"), submitted.stderr
    # Follow rank 0 at once: the command waits for the pod and its container, then streams until the pod ends.
    follow = subprocess.Popen(
        [str(VENV_BIN / "kuberl"), "logs", name, "--rank", "0", "-f", "-n", ns, "--kubeconfig", str(node.plane.kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # examples/client_quickstart.py on the same job, at the same time: its submit finds the job unchanged, it follows
    # rank 0 through the Python client and prints the final status.
    example = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "client_quickstart.py"), str(manifest), "-n", ns],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUBECONFIG": str(node.plane.kubeconfig)},
    )
    followed: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: followed.extend((time.monotonic(), line.rstrip("\n")) for line in follow.stdout))
    reader.start()
    try:
        waited = kuberl(node, "wait", name, "--for", "Succeeded", "--timeout", "600", "-n", ns, timeout=660)
        succeeded_at = time.monotonic()
        if waited.returncode != 0:
            logs = node.plane.kubectl("logs", "-n", ns, "-l", f"kuberl.dev/job={name}", "--tail=40", "--prefix", check=False)
            raise AssertionError(f"{waited.stderr}{kuberl(node, 'status', name, '-n', ns).stdout}\n{logs.stdout}{logs.stderr}")
        follow.wait(timeout=60)  # the stream ends with the pod
        reader.join(timeout=10)
        example_out, example_err = example.communicate(timeout=120)
    finally:
        for process in (follow, example):
            if process.poll() is None:
                process.kill()
    assert follow.returncode == 0, follow.stderr.read()
    assert example.returncode == 0, example_err[-3000:]
    assert f"submitted {name}\n" in example_out and f"done: {STEPS} steps" in example_out, example_out[-3000:]
    assert f"{name}: Succeeded at step {STEPS}/{STEPS} (100%)\n" in example_out, example_out[-3000:]
    # What kubectl logs shows of each pod: the ground truth. Rank 0 is the actor's first pod (hostname <job>-actor-0-0),
    # rank 1 its second (<job>-actor-peers-0-0).
    pods = json.loads(node.plane.kubectl("get", "pods", "-n", ns, "-l", f"kuberl.dev/job={name}", "-o", "json").stdout)["items"]
    rank_of = {f"{name}-actor-0-0": "0", f"{name}-actor-peers-0-0": "1"}
    truth = {
        rank_of[p["spec"]["hostname"]]: (
            p["metadata"]["name"],
            node.plane.kubectl("logs", p["metadata"]["name"], "-n", ns).stdout.splitlines(),
        )
        for p in pods
    }
    assert sorted(truth) == ["0", "1"] and truth["0"][1] != truth["1"][1]
    lines = [line for _, line in followed]
    assert lines == truth["0"][1] and any(f"done: {STEPS} steps" in line for line in lines), lines[-20:]
    # Streamed, not read at the end: the lines came while the job trained, over seconds, before it succeeded.
    assert followed[0][0] < succeeded_at and followed[-1][0] - followed[0][0] > 1.0, [t - succeeded_at for t, _ in followed[:3]]

    # Without -f: one rank's pod, one role's pods (prefixed with the pod's name), through the CLI and the client.
    rank1 = kuberl(node, "logs", name, "--rank", "1", "-n", ns)
    assert rank1.returncode == 0 and rank1.stdout.splitlines() == truth["1"][1], rank1.stderr
    by_pod: dict[str, list[str]] = {}
    for line in RLJobClient(kubeconfig=node.plane.kubeconfig, namespace=ns).logs(name, role="actor"):
        pod, _, text = line.partition("] ")
        by_pod.setdefault(pod.removeprefix("["), []).append(text)
    # (A progress bar's carriage returns split lines in kubectl's text; split the client's lines alike.)
    assert {pod: "\n".join(texts).splitlines() for pod, texts in by_pod.items()} == dict(truth.values())
    tail = kuberl(node, "logs", name, "--rank", "0", "--tail", "1", "-n", ns)
    assert tail.stdout.rstrip("\n") == node.plane.kubectl("logs", truth["0"][0], "-n", ns, "--tail=1").stdout.rstrip("\n")

    status = kuberl(node, "status", name, "-n", ns).stdout
    assert f"Step:         {STEPS}/{STEPS} (100%)" in status and "Phase:        Succeeded" in status, status
    assert kuberl(node, "delete", name, "-n", ns).stdout == f"{name} deleted\n"
