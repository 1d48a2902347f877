"""The product as one piece, on a real node: `helm install` runs the operator image in its own pod,
`kubectl apply` of an RLJob makes trainer pods from the trainer image that train with gloo over the
pod network, report progress, and survive a killed container, a deleted operator, a deleted trainer
pod (SIGTERM), suspension, and leave nothing behind when the RLJob is deleted.

Every job trains the same tiny model with the same seed, so each ends with the same weights as the
uninterrupted reference job, bit for bit, however it was interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from kuberl.operator.testing.node import OPERATOR_NAMESPACE
from kuberl.operator.testing.waiting import eventually

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent.parent
CHART = REPO / "helm" / "kuberl"
TRAINER_UID = 10001
# Steps enough that the faults, one after another on one job, all land before it ends: on a fast
# machine a step of the tiny model takes about 2 s and a fault with its gang restart 20 s. With 40, a
# run on a busy machine was at step 36 when the killed-container test began, too late for it.
STEPS, INTERVAL = 60, 3
DATA = "/data"  # where the job's volume is mounted in the trainer pods


def kubectl_json(node, *args: str) -> dict:
    return json.loads(node.plane.kubectl(*args, "-o", "json").stdout)


def operator_pod(node) -> dict:
    pods = kubectl_json(node, "get", "pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=kuberl")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return running[0] if len(running) == 1 else {}


class JobVolume:
    """A hostPath PersistentVolume on the node, bound to a claim in `namespace`: the tiny model, the
    checkpoints, the metrics and the export, seen by the pods under DATA and by the test at `host`."""

    def __init__(self, node, namespace: str, root: Path):
        from kuberl.engine.models.tiny import make_tiny_model

        self.namespace, self.host = namespace, root / namespace
        self.host.mkdir(parents=True)
        make_tiny_model(self.host / "model", seed=0)
        for path in [self.host, *self.host.rglob("*")]:
            os.chown(path, TRAINER_UID, TRAINER_UID)  # the pods run as this user; hostPath keeps owners
        self.claim = "job-data"
        docs = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"data-{namespace}"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(self.host), "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": self.claim},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": self.claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "volumeName": f"data-{namespace}",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        ]
        node.plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))

    def on_host(self, pod_path: str) -> Path:
        return self.host / Path(pod_path).relative_to(DATA)

    def records(self) -> list[dict]:
        path = self.host / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def exported(self) -> dict:
        from safetensors.torch import load_file

        return load_file(self.host / "final" / "model.safetensors")


def rljob(name: str, claim: str, image: str, requests: dict | None = None, steps: int | None = None, **run_policy) -> dict:
    job = {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "imagePullPolicy": "Never",
            "model": {"path": f"{DATA}/model", "dtype": "float32"},
            "data": {"train": {"generator": {"name": "arithmetic", "count": 32, "seed": 1, "maxOperand": 9}}, "maxPromptLength": 64},
            "algorithm": {"name": "grpo", "klCoef": 0.05},
            "rollout": {"samplesPerPrompt": 4, "maxNewTokens": 6, "kvCacheBytes": 64 << 20},
            "reward": {"rules": [{"name": "math_answer"}, {"name": "length_penalty", "weight": 0.1, "args": {"max_chars": 6}}]},
            # Two actor pods (DP=2, gloo across the pod network) and the reference on a pod of its own.
            "roles": {"actor": {"replicas": 2, "layout": {"dp": 2}}, "ref": {"replicas": 1}},
            "trainer": {
                "totalSteps": STEPS,
                "promptsPerStep": 4,
                "microBatchSize": 4,
                "seed": 3,
                "optimizer": {"lr": 1e-4},
                "checkpoint": {"path": DATA, "interval": INTERVAL, "keep": 2, "claimName": claim},
                "exportPath": f"{DATA}/final",
            },
            "runPolicy": {"backoffLimit": 3, "terminationGracePeriodSeconds": 120, **run_policy},
            "monitoring": {"enabled": True},
        },
    }
    if requests:  # what a queue's quota counts
        for role in job["spec"]["roles"].values():
            role["resources"] = {"requests": requests}
    if steps:
        job["spec"]["trainer"]["totalSteps"] = steps
    return job


class Job:
    """One RLJob in a namespace of its own, with its volume."""

    def __init__(
        self,
        node,
        image: str,
        volumes: Path,
        prefix: str,
        prepare=None,
        requests: dict | None = None,
        steps: int | None = None,
        **run_policy,
    ):
        self.node = node
        self.namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
        node.plane.kubectl("create", "namespace", self.namespace)
        # As docs/security.md asks of an admin: every pod of the job must pass Pod Security's restricted level.
        node.plane.kubectl("label", "namespace", self.namespace, "pod-security.kubernetes.io/enforce=restricted")
        if prepare is not None:
            prepare(self.namespace)  # what the namespace needs before the job (a LocalQueue)
        self.volume = JobVolume(node, self.namespace, volumes)
        self.name = prefix
        node.plane.kubectl(
            "apply",
            "-n",
            self.namespace,
            "-f",
            "-",
            input=json.dumps(rljob(self.name, self.volume.claim, image, requests, steps, **run_policy)),
        )

    def get(self) -> dict:
        return kubectl_json(self.node, "get", "rlj", self.name, "-n", self.namespace)

    def status(self) -> dict:
        return self.get().get("status") or {}

    def pods(self) -> list[dict]:
        return kubectl_json(self.node, "get", "pods", "-n", self.namespace, "-l", f"kuberl.dev/job={self.name}")["items"]

    def wait_for(self, check, timeout: float, what: str):
        try:
            return eventually(check, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from None

    def wait_for_phase(self, phase: str, timeout: float = 900) -> dict:
        return self.wait_for(lambda: self.status().get("phase") == phase and self.status(), timeout, f"phase {phase}")

    def wait_for_step(self, step: int, timeout: float = 600) -> int:
        return self.wait_for(lambda: (self.status().get("step") or 0) >= step and self.status()["step"], timeout, f"step {step}")

    def diagnosis(self) -> str:
        parts = [json.dumps(self.status(), indent=1)[-2000:]]
        for pod in self.pods():
            name = pod["metadata"]["name"]
            logs = self.node.plane.kubectl("logs", name, "-n", self.namespace, "--tail=30", check=False)
            parts.append(f"--- {name} {pod['status'].get('phase')}\n{logs.stdout}{logs.stderr}")
        operator = operator_pod(self.node)
        if operator:
            logs = self.node.plane.kubectl("logs", operator["metadata"]["name"], "-n", OPERATOR_NAMESPACE, "--tail=30", check=False)
            parts.append(f"--- operator\n{logs.stdout}")
        return "\n".join(parts)

    def delete(self) -> None:
        self.node.plane.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def volumes(real_node) -> Path:
    root = real_node.workdir / "volumes"
    root.mkdir(exist_ok=True)
    return root


class TrainerPrometheus:
    """A real Prometheus on the host that scrapes trainer pods as the chart's PodMonitor selects them.

    Neither the prometheus-operator nor Kubernetes discovery exists here (Debian builds Prometheus
    without it), so `discover` does what they would: it lists the pods matching the PodMonitor's
    selector through the API server and hands Prometheus their address and named port (file-based
    discovery). The scrape itself goes across the pod network to the trainer's own endpoint."""

    def __init__(self, node, workdir: Path):
        import subprocess

        import yaml

        from kuberl.operator.cli.ports import free_port

        prom = subprocess.run(["bash", str(REPO / "scripts" / "prometheus.sh")], capture_output=True, text=True, timeout=600)
        assert prom.returncode == 0, prom.stderr
        rendered = node.plane.helm(
            "template",
            "kuberl",
            str(CHART),
            "--kube-version",
            "1.37.2",
            "--set",
            "podMonitor.enabled=true,image.repository=unused,trainerImage=unused",
        ).stdout
        [monitor] = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PodMonitor"]
        self.node, self.workdir = node, workdir
        self.selector = ",".join(f"{k}={v}" for k, v in monitor["spec"]["selector"]["matchLabels"].items())
        self.port_name = monitor["spec"]["podMetricsEndpoints"][0]["port"]
        self.targets = workdir / "targets.json"
        self.targets.write_text("[]")
        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": [
                        {"job_name": "kuberl-trainers", "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}]}
                    ],
                }
            )
        )
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                str(Path(prom.stdout.strip().splitlines()[-1]) / "prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),
        )

    def discover(self, namespace: str) -> int:
        """Point Prometheus at the pods of `namespace` that the PodMonitor selects; how many there are."""
        targets = []
        pods = kubectl_json(self.node, "get", "pods", "-n", namespace, "-l", self.selector)["items"]
        for pod in pods:
            ip = pod["status"].get("podIP")
            ports = [p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if p.get("name") == self.port_name]
            if ip and ports:
                targets.append({"targets": [f"{ip}:{ports[0]}"], "labels": {"namespace": namespace, "pod": pod["metadata"]["name"]}})
        self.targets.write_text(json.dumps(targets))
        return len(targets)

    def query(self, expr: str) -> list:
        import urllib.parse
        import urllib.request

        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def trainer_prometheus(real_node, tmp_path_factory):
    prometheus = TrainerPrometheus(real_node, tmp_path_factory.mktemp("trainer-prometheus"))
    yield prometheus
    prometheus.stop()


@pytest.fixture(scope="module")
def reference(real_node, operator_release, trainer_prometheus, built_images, volumes) -> Job:
    """The uninterrupted job: trains to the end in real pods."""
    job = Job(real_node, built_images["TRAINER_IMAGE"], volumes, "reference")
    job.wait_for(lambda: trainer_prometheus.discover(job.namespace), 300, "the controller rank's pod to have an address")
    job.wait_for_phase("Succeeded")
    return job


def test_prometheus_scraped_the_controller_rank_through_the_pod_monitors_selector(reference: Job, trainer_prometheus) -> None:
    result = trainer_prometheus.query(f'max_over_time(kuberl_step{{namespace="{reference.namespace}"}}[30m])')
    # Only the actor's pod 0 matches, and it served the engine's gauges while the job ran.
    assert len(result) == 1 and result[0]["metric"]["pod"].startswith("reference-actor-0"), result
    assert 1 <= float(result[0]["value"][1]) <= STEPS


def test_helm_install_runs_the_operator_image_locked_down(real_node, operator_release) -> None:
    pod = eventually(lambda: operator_pod(real_node), 120, "the operator pod to run")
    spec = pod["spec"]
    container = spec["containers"][0]
    assert spec["serviceAccountName"] == "kuberl"
    assert spec["securityContext"]["runAsUser"] == TRAINER_UID and spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # The container really runs as that user: the kubelet reports its process's identity.
    out = real_node.plane.kubectl("exec", "-n", OPERATOR_NAMESPACE, pod["metadata"]["name"], "--", "id", "-u", check=False)
    assert out.stdout.strip() == str(TRAINER_UID), out.stderr


def test_an_rljob_trains_in_real_pods_and_reports_its_checkpoint(real_node, reference: Job) -> None:
    status = reference.status()
    assert status["phase"] == "Succeeded" and status["step"] == STEPS and status.get("restarts", 0) == 0
    assert "rewardMean" in status["metrics"]
    # What a user sees: kubectl's printer columns.
    table = real_node.plane.kubectl("get", "rlj", reference.name, "-n", reference.namespace).stdout
    assert "Succeeded" in table and f" {STEPS} " in table, table
    checkpoint = status["lastCheckpoint"]
    assert checkpoint["step"] == STEPS and checkpoint["time"]
    assert (reference.volume.on_host(checkpoint["path"]) / "meta.json").is_file()
    # Each trainer pod ran under the restricted security context, from the trainer image.
    for pod in reference.pods():
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["spec"]["securityContext"]["runAsUser"] == TRAINER_UID
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(reference.volume.host / "final")
    assert model.config.num_hidden_layers == 2
    # Rank 0 was found through the headless Service's DNS name (MASTER_ADDR) from the other pods.
    assert [r["step"] for r in reference.volume.records()] == list(range(1, STEPS + 1))
    # The operator's own log has no refused request.
    operator = operator_pod(real_node)["metadata"]["name"]
    log = real_node.plane.kubectl("logs", operator, "-n", OPERATOR_NAMESPACE).stdout
    assert "forbidden" not in log.lower() and "Traceback" not in log, log[-3000:]


def _container_pid(node, pod: dict) -> int:
    """The host pid of a pod's trainer container, from containerd."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    tasks = node.ctr("tasks", "list").stdout.splitlines()  # TASK PID STATUS
    return int(next(line.split()[1] for line in tasks if line.startswith(container_id)))


def _actor_pod(job: Job, index: int) -> dict:
    """The running actor pod `index` (0: the controller rank's, replicated job "actor"; 1: "actor-peers")."""
    host = f"{job.name}-actor-0-0" if index == 0 else f"{job.name}-actor-peers-0-{index - 1}"
    return next(p for p in job.pods() if p["spec"].get("hostname") == host and p["status"].get("phase") == "Running")


# One job goes through every fault in turn (the tests below run in this order and share it): each
# interruption costs a gang restart, and one job keeps the tier's time within CI's budget.


@pytest.fixture(scope="module")
def gauntlet(real_node, reference: Job, built_images, volumes):
    job = Job(real_node, built_images["TRAINER_IMAGE"], volumes, "gauntlet")
    yield job
    job.delete()


def test_a_deleted_operator_pod_is_replaced_and_the_job_goes_on(real_node, gauntlet: Job) -> None:
    gauntlet.wait_for_step(1)
    old = operator_pod(real_node)["metadata"]["name"]
    real_node.plane.kubectl("delete", "pod", old, "-n", OPERATOR_NAMESPACE, "--wait=false")
    eventually(lambda: operator_pod(real_node) and operator_pod(real_node)["metadata"]["name"] != old, 180, "a new operator pod")
    step = gauntlet.status()["step"]
    gauntlet.wait_for_step(step + 1)  # the new operator reports progress again
    assert gauntlet.status().get("restarts", 0) == 0
    jobs = kubectl_json(real_node, "get", "jobs", "-n", gauntlet.namespace)["items"]
    names = sorted(j["metadata"]["name"] for j in jobs)
    assert names == [f"{gauntlet.name}-actor-0", f"{gauntlet.name}-actor-peers-0", f"{gauntlet.name}-ref-0"]  # no duplicates
    assert len(kubectl_json(real_node, "get", "jobsets", "-n", gauntlet.namespace)["items"]) == 1


def test_a_deleted_trainer_pod_checkpoints_the_running_step_and_nothing_is_lost(real_node, gauntlet: Job) -> None:
    from kuberl.engine.runtime.checkpoint import complete_steps

    victim = _actor_pod(gauntlet, 1)
    # What a drain or a preemption does: SIGTERM, then the grace period.
    real_node.plane.kubectl("delete", "pod", victim["metadata"]["name"], "-n", gauntlet.namespace, "--grace-period=120", "--wait=false")
    gauntlet.wait_for(lambda: gauntlet.status().get("restarts") == 1, 300, "a gang restart")
    stopped = max(complete_steps(gauntlet.volume.host))
    gauntlet.wait_for_step(stopped + 1)
    steps = [r["step"] for r in gauntlet.volume.records()]
    # The running step finished and was checkpointed (whatever the interval); the restarted gang went
    # on with the next one: no step lost, none done twice.
    assert steps == list(range(1, len(steps) + 1)), steps


def test_a_killed_container_restarts_the_gang_from_the_last_checkpoint(real_node, gauntlet: Job) -> None:
    from kuberl.engine.runtime.checkpoint import complete_steps

    # Just past a periodic checkpoint, before the next one. The controller's own record of each step
    # (metrics.jsonl on the volume) is watched, not the status, which lags a step or two behind.
    def last_step() -> int:
        path = gauntlet.volume.host / "metrics.jsonl"
        text = path.read_text() if path.exists() else ""
        complete = text[: text.rfind("\n") + 1].splitlines()  # not a line still being written
        return json.loads(complete[-1])["step"] if complete else 0

    now = last_step()
    target = (now // INTERVAL + 1) * INTERVAL + 1
    assert target < STEPS, f"too few steps left to kill between two checkpoints (at {now})"
    # A step of this job takes about 0.1 s here, so the window before the next checkpoint is a few
    # tenths of a second: the container is found first and the records are polled every 10 ms
    # (polling every 0.3 s and looking the container up after the step let the kill land after the
    # next checkpoint, and the test failed once in CI).
    victim_pod = _actor_pod(gauntlet, 1)["metadata"]["name"]
    victim = _container_pid(real_node, _actor_pod(gauntlet, 1))
    deadline = time.monotonic() + 600
    while last_step() < target:
        assert time.monotonic() < deadline, f"no step {target} within 600 s\n{gauntlet.diagnosis()}"
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)
    before = len(gauntlet.volume.records())
    gauntlet.wait_for(lambda: gauntlet.status().get("restarts") == 2, 300, "a second gang restart")
    # The killed pod is the one blamed, not the controller's rank that failed on the lost link after it (PeerLost):
    # by its name, or by its Job's where JobSet's restart took the pod before the operator read it.
    failures = {f["attempt"]: f for f in gauntlet.status().get("failures", [])}
    blamed = failures[1]
    if blamed.get("pod"):
        assert (blamed["pod"], blamed.get("exitCode")) == (victim_pod, 137), failures
        events = kubectl_json(real_node, "get", "events", "-n", gauntlet.namespace, "--field-selector", "reason=GangRestart")["items"]
        assert any(victim_pod in e["message"] for e in events), [e["message"] for e in events]
    else:
        assert blamed.get("reason") == "PodLost" and f"its Job {gauntlet.name}-actor-peers-0" in blamed.get("message", ""), failures
    resumed_from = max(complete_steps(gauntlet.volume.host))
    gauntlet.wait_for(lambda: len(gauntlet.volume.records()) > before + 1, 600, "two steps after the restart")
    steps = [r["step"] for r in gauntlet.volume.records()]
    # The restarted gang went on from the last complete checkpoint: the step after it comes next,
    # and every step after the checkpoint that had already run ran again.
    assert resumed_from < steps[before - 1] + 1 and steps[before] == resumed_from + 1, (steps, before, resumed_from)
    assert steps[before : before + 2] == [resumed_from + 1, resumed_from + 2], steps


def test_suspend_removes_the_pods_and_resume_continues_from_the_checkpoint(real_node, gauntlet: Job) -> None:
    patch = lambda value: real_node.plane.kubectl(  # noqa: E731
        "patch",
        "rlj",
        gauntlet.name,
        "-n",
        gauntlet.namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"runPolicy": {"suspend": value}}}),
    )
    patch(True)
    gauntlet.wait_for(lambda: gauntlet.status().get("phase") == "Suspended" and not gauntlet.pods(), 300, "Suspended with no pod")
    checkpoint = gauntlet.status()["lastCheckpoint"]["step"]
    before = len(gauntlet.volume.records())
    patch(False)
    status = gauntlet.wait_for_phase("Succeeded")
    assert status["step"] == STEPS and status["lastCheckpoint"]["step"] == STEPS
    after = [r["step"] for r in gauntlet.volume.records()][before:]
    assert after == list(range(checkpoint + 1, STEPS + 1)), after  # from the suspension's checkpoint on


def test_the_interrupted_job_ends_bitwise_equal_to_the_uninterrupted_one(gauntlet: Job, reference: Job) -> None:
    import torch

    assert gauntlet.status()["phase"] == "Succeeded"
    a, b = reference.volume.exported(), gauntlet.volume.exported()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs from the uninterrupted job's"


def test_deleting_the_rljob_leaves_nothing_behind(real_node, gauntlet: Job) -> None:
    real_node.plane.kubectl("delete", "rlj", gauntlet.name, "-n", gauntlet.namespace, "--wait=true", "--timeout=120s")

    def nothing_left() -> bool:
        kinds = "jobsets,pods,jobs,services,configmaps,serviceaccounts,roles,rolebindings"
        return not kubectl_json(real_node, "get", kinds, "-n", gauntlet.namespace, "-l", f"kuberl.dev/job={gauntlet.name}")["items"]

    gauntlet.wait_for(nothing_left, 120, "every child of the deleted RLJob to be gone")


# --- Kueue: a preempted job loses nothing ------------------------------------------------------------

NODE_QUEUE = "node-cpu"
# 3 pods of 200m: one job fits the queue's 1 CPU, two do not (the node itself has room for both).
REQUESTS = {"cpu": "200m", "memory": "256Mi"}


def _node_queue(node, namespace: str) -> None:
    """A ClusterQueue of 1 CPU on the node (its own flavor), priorities, and a LocalQueue in `namespace`."""
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "node"}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": NODE_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": "node",
                                "resources": [{"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "16Gi"}],
                            }
                        ],
                    }
                ],
            },
        },
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": "node-low"}, "value": 10},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": "node-high"}, "value": 1000},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": NODE_QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": NODE_QUEUE},
        },
    ]
    node.plane.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def test_a_preempted_job_checkpoints_waits_resumes_and_ends_bitwise_equal(real_node, reference: Job, built_images, volumes) -> None:
    """A low-priority job trains; a high-priority one arrives and Kueue preempts the first: its pods get
    SIGTERM, stop at a step boundary with a checkpoint, and it waits (Queued, counted as a preemption, not
    a restart). When the high one ends, it is admitted again, resumes from that checkpoint, and ends with
    the uninterrupted job's weights, bit for bit."""
    queued = lambda priority: {"scheduling": {"queueName": NODE_QUEUE, "workloadPriorityClass": priority}}  # noqa: E731
    low = Job(
        real_node,
        built_images["TRAINER_IMAGE"],
        volumes,
        "low",
        prepare=lambda ns: _node_queue(real_node, ns),
        requests=REQUESTS,
        **queued("node-low"),
    )
    high = None
    try:
        low.wait_for_step(INTERVAL + 1)
        high = Job(
            real_node,
            built_images["TRAINER_IMAGE"],
            volumes,
            "high",
            prepare=lambda ns: _node_queue(real_node, ns),
            requests=REQUESTS,
            steps=4,
            **queued("node-high"),
        )
        status = low.wait_for(
            lambda: (s := low.status()).get("phase") == "Queued" and s.get("preemptions") == 1 and s, 300, "the low job preempted"
        )
        queued_condition = next(c for c in status["conditions"] if c["type"] == "Queued")
        assert queued_condition["reason"] == "Preempted" and status.get("restarts", 0) == 0
        low.wait_for(
            lambda: not [p for p in low.pods() if p["status"].get("phase") in ("Pending", "Running")], 300, "the preempted pods to stop"
        )
        from kuberl.engine.runtime.checkpoint import complete_steps

        stopped_at = max(complete_steps(low.volume.host))
        steps_before = [r["step"] for r in low.volume.records()]
        # The step that was running when SIGTERM came was finished and checkpointed, whatever the interval.
        assert stopped_at == steps_before[-1] and steps_before == list(range(1, stopped_at + 1)), (stopped_at, steps_before)
        assert not low.pods() or all(p["status"].get("phase") != "Running" for p in low.pods())

        high.wait_for_phase("Succeeded")
        final = low.wait_for_phase("Succeeded")
        assert (final["preemptions"], final.get("restarts", 0), final["step"]) == (1, 0, STEPS)
        steps = [r["step"] for r in low.volume.records()]
        assert steps == list(range(1, STEPS + 1)), steps  # resumed after the checkpoint: no step lost, none twice
        import torch

        a, b = reference.volume.exported(), low.volume.exported()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "differs from the uninterrupted job"
        events = kubectl_json(real_node, "get", "events", "-n", low.namespace, "--field-selector", f"involvedObject.name={low.name}")
        assert any(e["reason"] == "Preempted" for e in events["items"])
    finally:
        low.delete()
        if high is not None:
            high.delete()
