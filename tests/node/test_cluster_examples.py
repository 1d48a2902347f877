"""Jobs that reach their data on a real node: files on a PersistentVolumeClaim, and a model from the hub
(through the tests' stand-in for it) fetched once by the initializer into a shared cache claim.

- A job reads its prompts, its reward function and an algorithm plug-in from a claim and trains.
- examples/ppo-cluster (PPO, 2 actor pods and a critic pod) runs through its overlay
  examples/real-node/ppo-cluster: the same claims, data layout, Secret and cache as on a GPU cluster.
  The hub stand-in's request log shows each file fetched once, a force-deleted critic pod restarts
  the gang with no second fetch (the restart's event and record name the critic, and the job's
  phases, watched through the API, never go back within an attempt), a second job on the same repository fetches nothing, and a refused
  token and a missing repository each fail their job with the initializer's reason.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from kuberl.operator.testing.cleanup import delete_namespace
from kuberl.operator.testing.waiting import eventually

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent.parent
TRAINER_UID = 10001
TINY_REPO = "kuberl-tests/tiny-llama"  # the overlay's model
PPO = "ppo-qwen-math"
PPO_NAMESPACE = "rl"  # the example's


def kubectl_json(node, *args: str) -> dict:
    return json.loads(node.plane.kubectl(*args, "-o", "json").stdout)


def status(node, namespace: str, name: str) -> dict:
    return kubectl_json(node, "get", "rlj", name, "-n", namespace).get("status") or {}


def condition(s: dict, kind: str) -> dict:
    return next((c for c in s.get("conditions", []) if c["type"] == kind), {})


def diagnosis(node, namespace: str) -> str:
    parts = []
    for pod in kubectl_json(node, "get", "pods", "-n", namespace)["items"]:
        name = pod["metadata"]["name"]
        logs = node.plane.kubectl("logs", name, "-n", namespace, "--tail=25", check=False)
        parts.append(f"--- {name} {pod['status'].get('phase')}\n{logs.stdout}{logs.stderr}")
    return "\n".join(parts)


def wait_for(node, namespace: str, check, timeout: float, what: str):
    try:
        return eventually(check, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnosis(node, namespace)}") from None


def wait_phase(node, namespace: str, name: str, phase: str, timeout: float = 900) -> dict:
    return wait_for(
        node, namespace, lambda: (s := status(node, namespace, name)).get("phase") == phase and s, timeout, f"{namespace}/{name} {phase}"
    )


def host_claim(node, namespace: str, claim: str, host: Path, *, create_claim: bool, read_only: bool = False) -> Path:
    """A hostPath PersistentVolume on the node, bound ahead to claim `namespace/claim` (as a cluster admin
    provisions storage), its folder owned by the trainer's user; with `create_claim`, the claim too.
    The volume's name carries this module's tag: other modules bind claims of the same names."""
    host.mkdir(parents=True, exist_ok=True)
    for path in [host, *host.rglob("*")]:
        os.chown(path, TRAINER_UID, TRAINER_UID)  # the pods run as this user; hostPath keeps owners
    docs = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"examples-{namespace}-{claim}"},
            "spec": {
                "capacity": {"storage": "500Gi"},
                "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(host), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        }
    ]
    if create_claim:
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteOnce"],
                    "storageClassName": "",
                    "volumeName": f"examples-{namespace}-{claim}",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        )
    node.plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    return host


def records(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


@pytest.fixture(scope="module")
def volumes(real_node) -> Path:
    root = real_node.workdir / "example-volumes"
    root.mkdir(exist_ok=True)
    return root


# --- data, reward and plug-in from a claim ----------------------------------------------------------


REWARD = '''
def reward(prompt: str, response: str, answer: str) -> float:
    """1 when the response ends with the answer: a user's own rule, read from the claim."""
    return 1.0 if response.strip().endswith(answer) else 0.0
'''


def test_a_job_reads_its_prompts_reward_and_plugin_from_a_claim_and_trains(real_node, operator_release, built_images, volumes) -> None:
    from kuberl.engine.models.tiny import make_tiny_model

    node, ns = real_node, f"claims-{uuid.uuid4().hex[:6]}"
    node.plane.kubectl("create", "namespace", ns)
    files = volumes / ns / "files"
    make_tiny_model(files / "model", seed=0)
    (files / "data").mkdir(parents=True)
    (files / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n" for a in range(4) for b in range(4))
    )
    (files / "rewards").mkdir()
    (files / "rewards" / "ends_with_answer.py").write_text(REWARD)
    (files / "plugins").mkdir()
    shutil.copy(REPO / "examples" / "plugins" / "median_baseline.py", files / "plugins")
    host_claim(node, ns, "rl-files", files, create_claim=True, read_only=True)
    out = host_claim(node, ns, "rl-out", volumes / ns / "out", create_claim=True)
    job = {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "from-claim", "namespace": ns},
        "spec": {
            "image": built_images["TRAINER_IMAGE"],
            "imagePullPolicy": "Never",
            "volumes": [{"name": "files", "persistentVolumeClaim": {"claimName": "rl-files", "readOnly": True}}],
            "model": {"path": "/data/model", "dtype": "float32"},
            "data": {"train": {"path": "/data/data/train.jsonl"}, "maxPromptLength": 64},
            # The estimator exists only in the plug-in: the job could not start without reading it.
            "algorithm": {
                "name": "grpo",
                "plugins": [{"path": "/data/plugins/median_baseline.py"}],
                "advantage": {"name": "median_baseline"},
            },
            "rollout": {"samplesPerPrompt": 4, "maxNewTokens": 6, "kvCacheBytes": 64 << 20},
            "reward": {"python": {"path": "/data/rewards/ends_with_answer.py", "function": "reward"}},
            "roles": {"actor": {"replicas": 1, "volumeMounts": [{"name": "files", "mountPath": "/data", "readOnly": True}]}},
            "trainer": {
                "totalSteps": 4,
                "promptsPerStep": 4,
                "microBatchSize": 4,
                "seed": 3,
                "optimizer": {"lr": 1e-4},
                "checkpoint": {"path": "/out", "claimName": "rl-out", "interval": 2},
                "exportPath": "/out/final",
            },
            "monitoring": {"enabled": False},
        },
    }
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(job))
    s = wait_phase(node, ns, "from-claim", "Succeeded")
    assert s["step"] == 4 and s.get("restarts", 0) == 0
    steps = records(out / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all("reward/python:reward" in r for r in steps)  # the claim's reward function scored every step
    import transformers

    assert transformers.AutoModelForCausalLM.from_pretrained(out / "final").config.num_hidden_layers == 2
    node.plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# --- the PPO example, its model from the hub ---------------------------------------------------------


@pytest.fixture(scope="module")
def ppo(real_node, operator_release, built_images, volumes, hub, hub_token, tmp_path_factory):
    """examples/real-node/ppo-cluster applied as a user applies the example: namespace, Secret, claims
    (bound to volumes an admin provisioned; gsm8k holds GSM8K-shaped parquet files), then `kubectl apply -k`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kuberl.engine.models.tiny import make_tiny_model

    node = real_node
    hub.add_repo(TINY_REPO, make_tiny_model(tmp_path_factory.mktemp("hub") / "tiny-llama", seed=0))
    node.plane.kubectl("create", "namespace", PPO_NAMESPACE)
    node.plane.kubectl("create", "secret", "generic", "hf-token", "-n", PPO_NAMESPACE, f"--from-literal=token={hub_token}")
    data = volumes / "gsm8k"
    (data / "gsm8k").mkdir(parents=True)
    for split, pairs in (("train", [(a, b) for a in range(8) for b in range(4)]), ("test", [(a, 9) for a in range(8)])):
        table = pa.table(
            {
                "question": [f"What is {a} + {b}?" for a, b in pairs],
                "answer": [f"{a} plus {b} makes {a + b}.\n#### {a + b}" for a, b in pairs],
            }
        )
        pq.write_table(table, data / "gsm8k" / f"{split}.parquet")
    host_claim(node, PPO_NAMESPACE, "gsm8k", data, create_claim=False)
    cache = host_claim(node, PPO_NAMESPACE, "hub-cache", volumes / "hub-cache", create_claim=False)
    checkpoints = host_claim(node, PPO_NAMESPACE, "ppo-qwen-math-ckpt", volumes / "ppo-ckpt", create_claim=False)
    node.plane.kubectl("apply", "-k", str(REPO / "examples" / "real-node" / "ppo-cluster"))
    rendered = node.plane.kubectl("kustomize", str(REPO / "examples" / "real-node" / "ppo-cluster")).stdout
    yield {"cache": cache, "checkpoints": checkpoints, "rendered": rendered}
    # The quickstart uses the namespace too (the examples' own): leave it gone, with its volumes.
    delete_namespace(node.plane, PPO_NAMESPACE)
    ours = [pv["metadata"]["name"] for pv in kubectl_json(node, "get", "pv")["items"] if pv["metadata"]["name"].startswith("examples-")]
    if ours:
        node.plane.kubectl("delete", "pv", *ours, "--wait=false", check=False)


def _variant(node, ppo: dict, name: str, **model) -> None:
    """Another RLJob like the example's, under `name`, its model changed by `model`."""
    from kuberl.operator.validation.manifest import read_documents  # YAML as kubectl reads it (1e-06 is a number)

    [doc] = [d.content for d in read_documents(ppo["rendered"], "overlay") if d.content.get("kind") == "RLJob"]
    doc["metadata"]["name"] = name
    doc["spec"]["model"].update(model)
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(doc))


def forward(seen: list[str], order: list[str]) -> bool:
    """Whether `seen` goes through `order` forward, some phases passed over (between two reconciles)."""
    at = [order.index(p) if p in order else -1 for p in seen]
    return -1 not in at and at == sorted(set(at))


class PhaseWatch:
    """The RLJob's phases as the API server's watch delivers every change of the object: none is missed
    between two polls. `stop()` returns them, each change once."""

    def __init__(self, node, namespace: str, name: str):
        from kubernetes import client, watch

        self.phases: list[str] = []
        self.stopped = False
        self.ended: BaseException | None = None
        """Why the watch ended before stop() (phases may then be missing)."""
        self.watch = watch.Watch()
        custom = client.CustomObjectsApi(node.plane.api_client())
        args = ("kuberl.dev", "v1alpha1", namespace, "rljobs")
        start = custom.list_namespaced_custom_object(*args, field_selector=f"metadata.name={name}")
        self._add(start["items"])
        version = start["metadata"]["resourceVersion"]

        def follow() -> None:
            try:
                for event in self.watch.stream(
                    custom.list_namespaced_custom_object, *args, field_selector=f"metadata.name={name}", resource_version=version
                ):
                    self._add([event["object"]])
            except Exception as exc:  # noqa: BLE001 - closing the stream in stop() ends it this way too
                if not self.stopped:
                    self.ended = exc

        self.thread = threading.Thread(target=follow, daemon=True)
        self.thread.start()

    def _add(self, objects: list[dict]) -> None:
        for obj in objects:
            phase = (obj.get("status") or {}).get("phase")
            if phase and (not self.phases or self.phases[-1] != phase):
                self.phases.append(phase)

    def stop(self) -> list[str]:
        time.sleep(1)  # the last change's event, on its way
        self.stopped = True
        self.watch.stop()
        assert self.ended is None, f"the watch ended early, phases may be missing: {self.ended!r}"
        return list(self.phases)


def test_the_ppo_example_fetches_its_model_once_and_trains_through_a_force_deleted_critic(real_node, ppo, hub) -> None:
    node = real_node
    s = wait_for(
        node, PPO_NAMESPACE, lambda: (s := status(node, PPO_NAMESPACE, PPO)).get("initialization") and s, 600, "the initializer's report"
    )
    files = hub.file_fetches(TINY_REPO)
    assert files and set(files.values()) == {1}, files  # every file of the snapshot, once
    assert s["initialization"]["fetchedBytes"] > 0 and condition(s, "Initialized")["reason"] == "CacheReady"
    from kuberl.engine.hub.cache import endpoint_cache_dir

    # In the claim, for every pod, in the folder of the hub it came from (the chart's hubEndpoint).
    assert (endpoint_cache_dir(ppo["cache"] / "hub", hub.url) / "models--kuberl-tests--tiny-llama").is_dir()

    # A force-deleted critic pod (a lost node, `kubectl delete --force`), past the first checkpoint: the whole
    # gang restarts from it, and the critic is blamed, not the actor ranks that failed on the lost link after it.
    # The job's steps take a second or two here and the status lags behind them: the controller's own
    # record of each step (metrics.jsonl on the claim) is watched, every 10 ms, with the critic found first.
    phases = PhaseWatch(node, PPO_NAMESPACE, PPO)

    def wait_for_step(step: int) -> None:
        deadline = time.monotonic() + 600
        while max((r["step"] for r in records(ppo["checkpoints"] / "metrics.jsonl")), default=0) < step:
            assert time.monotonic() < deadline, f"no step {step} in metrics.jsonl within 600 s"
            time.sleep(0.01)

    wait_for_step(2)
    [critic] = [
        p["metadata"]["name"]
        for p in kubectl_json(node, "get", "pods", "-n", PPO_NAMESPACE, "-l", f"kuberl.dev/job={PPO},kuberl.dev/role=critic")["items"]
    ]
    wait_for_step(3)
    node.plane.kubectl("delete", "pod", critic, "-n", PPO_NAMESPACE, "--force", "--grace-period=0")
    wait_for(node, PPO_NAMESPACE, lambda: status(node, PPO_NAMESPACE, PPO).get("restarts") == 1, 300, "a gang restart")
    s = wait_phase(node, PPO_NAMESPACE, PPO, "Succeeded")
    seen = phases.stop()
    [blamed] = s["failures"]
    assert blamed["attempt"] == 0 and blamed["role"] == "critic", s["failures"]
    assert blamed["pod"] in ("", critic), blamed  # named, or through its Job where the pod was gone before it was read
    restarts = [
        e["message"]
        for e in kubectl_json(node, "get", "events", "-n", PPO_NAMESPACE, "--field-selector", "reason=GangRestart")["items"]
        if e["involvedObject"]["name"] == PPO
    ]
    assert restarts and all("critic" in m for m in restarts), restarts
    # Every phase the API held since the cache was filled, in order: forward within an attempt, back only
    # through Restarting (a phase may be passed between two reconciles: Restarting, then Running at once).
    assert seen.count("Restarting") == 1 and seen[-1] == "Succeeded", seen
    restart = seen.index("Restarting")
    assert forward(seen[:restart], ["Pending", "Initializing", "Starting", "Running"]), seen
    assert forward(seen[restart + 1 :], ["Starting", "Running", "Succeeded"]), seen
    assert s["step"] == 8 and s["restarts"] == 1  # 32 prompts, 8 a step, 2 epochs
    assert hub.file_fetches(TINY_REPO) == files  # the restarted pods read the cache: nothing fetched again
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ppo["checkpoints"] / "final")
    assert model.config.num_hidden_layers == 2
    assert (ppo["checkpoints"] / "tensorboard").is_dir()


def test_a_second_job_on_the_same_repository_fetches_nothing(real_node, ppo, hub) -> None:
    node = real_node
    wait_phase(node, PPO_NAMESPACE, PPO, "Succeeded")  # after the example, so the cache holds the model
    before = hub.file_fetches(TINY_REPO)
    _variant(node, ppo, "ppo-again")
    s = wait_for(
        node,
        PPO_NAMESPACE,
        lambda: (s := status(node, PPO_NAMESPACE, "ppo-again")).get("initialization") and s,
        300,
        "the second initializer's report",
    )
    assert s["initialization"]["fetchedBytes"] == 0 and "nothing fetched" in condition(s, "Initialized")["message"]
    assert hub.file_fetches(TINY_REPO) == before
    # Deleted as its ranks start: they have nothing to save and exit at once, not after the pods'
    # 300 s grace period (a rank waiting for a peer that is gone, or not yet past Python's start-up).
    trainers = lambda: kubectl_json(node, "get", "pods", "-n", PPO_NAMESPACE, "-l", "kuberl.dev/job=ppo-again,kuberl.dev/role")["items"]  # noqa: E731
    wait_for(
        node, PPO_NAMESPACE, lambda: any(p["status"].get("phase") == "Running" for p in trainers()), 300, "ppo-again's trainer pods running"
    )
    node.plane.kubectl("delete", "rlj", "ppo-again", "-n", PPO_NAMESPACE, "--wait=false")
    wait_for(node, PPO_NAMESPACE, lambda: not trainers(), 90, "ppo-again's pods gone within 90 s of its deletion")


@pytest.mark.parametrize(
    ("name", "change", "reason"),
    [
        ("ppo-bad-token", {"tokenSecretRef": {"name": "hf-token-wrong", "key": "token"}}, "TokenRefused"),
        ("ppo-no-repo", {"hubId": "kuberl-tests/no-such-model"}, "RepositoryNotFound"),
    ],
)
def test_a_refused_token_or_a_missing_repository_fails_the_job_with_the_reason(real_node, ppo, name, change, reason) -> None:
    node = real_node
    node.plane.kubectl("create", "secret", "generic", "hf-token-wrong", "-n", PPO_NAMESPACE, "--from-literal=token=hf_wrong", check=False)
    started = time.monotonic()
    _variant(node, ppo, name, **change)
    s = wait_phase(node, PPO_NAMESPACE, name, "Failed", timeout=300)
    failed = condition(s, "Failed")
    assert failed["reason"] == reason, failed
    assert change.get("hubId", TINY_REPO) in failed["message"] and "hf_wrong" not in json.dumps(s)
    assert not kubectl_json(node, "get", "pods", "-n", PPO_NAMESPACE, "-l", f"kuberl.dev/job={name},kuberl.dev/role")["items"]
    assert time.monotonic() - started < 300
