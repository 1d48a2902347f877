"""RLJobs through a real Kueue (v0.17, with a real JobSet controller) on the test control plane's kwok GPU pools.

The queue is examples/kueue/queues.yaml as shipped: a ClusterQueue of 16 H100 GPUs (the two 8-GPU kwok
nodes of the gpu-h100 pool), a LocalQueue rl-gpus in namespace rl, and two WorkloadPriorityClasses.
Every job's pods are one JobSet, which Kueue admits as one Workload: all of them, or none.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kuberl.operator.testing.rljobs import create, jobsets, live_pods, pods, status, wait_phase
from kuberl.operator.testing.scheduling import wait_for_garbage_collector
from kuberl.operator.testing.control_plane import EXIT_ANNOTATION

REPO = Path(__file__).resolve().parent.parent.parent
NS = "rl"
QUEUE = "rl-gpus"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
H100 = {
    "nodeSelector": {"kuberl.dev/pool": "gpu-h100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


@pytest.fixture(scope="module")
def queue(control_plane, operator, schedulers) -> str:
    """The example's queues, applied as a user applies them."""
    plane = control_plane
    plane.kubectl("create", "namespace", NS)
    plane.kubectl("apply", "--server-side", "-f", str(REPO / "examples" / "kueue" / "queues.yaml"))
    wait_for_garbage_collector(plane)  # a finished job's JobSet must go with it, and free the quota

    def active() -> bool:
        cq = client.CustomObjectsApi(plane.api_client()).get_cluster_custom_object(*KUEUE, "clusterqueues", QUEUE)
        return any(c["type"] == "Active" and c["status"] == "True" for c in cq.get("status", {}).get("conditions", []))

    from kuberl.operator.testing.waiting import eventually

    eventually(active, 60, "the ClusterQueue Active")
    return QUEUE


def gpu_job(name: str, *, actor_pods: int = 2, critic_pods: int = 0, priority: str | None = None) -> dict[str, Any]:
    """A job of `actor_pods` 8-GPU H100 pods (and a critic of `critic_pods` such pods) in the example's queue."""
    ppo = critic_pods > 0
    spec: dict[str, Any] = {
        "model": {"path": "/data/models/m"},
        "data": {"train": {"path": "/data/train.jsonl"}},
        "volumes": [{"name": "data", "emptyDir": {}}],
        "algorithm": {"name": "ppo" if ppo else "grpo"},
        "rollout": {"samplesPerPrompt": 4},
        "reward": {"rules": [{"name": "math_answer"}]},
        "roles": {
            "actor": {
                "replicas": actor_pods,
                "gpusPerReplica": 8,
                **H100,
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            }
        },
        "trainer": {"totalSteps": 10, "promptsPerStep": 16},
        "runPolicy": {
            "scheduling": {"queueName": QUEUE, **({"workloadPriorityClass": priority} if priority else {})},
            "terminationGracePeriodSeconds": 5,
        },
    }
    if ppo:
        spec["roles"]["critic"] = {
            "replicas": critic_pods,
            "gpusPerReplica": 8,
            **H100,
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        }
    return {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}


class PodWatch:
    """Every pod of a job ever seen (a watch in a thread): "never a pod" is checked over the whole test."""

    def __init__(self, plane, namespace: str, job: str):
        from kubernetes import watch

        self.seen: set[str] = set()
        self._watch = watch.Watch()
        api = client.CoreV1Api(plane.api_client())

        self._stopped = False

        def run() -> None:
            try:
                for event in self._watch.stream(
                    api.list_namespaced_pod, namespace, label_selector=f"kuberl.dev/job={job}", timeout_seconds=600
                ):
                    self.seen.add(event["object"].metadata.name)
            except Exception:  # noqa: BLE001 - the stream ends with an error when stop() closes it
                if not self._stopped:
                    raise

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> set[str]:
        self._stopped = True
        self._watch.stop()
        return self.seen


def finish(plane, job: str) -> None:
    """What kwok does for a finished rank: every pod of the job exits 0."""
    for pod in live_pods(plane, NS, job):
        client.CoreV1Api(plane.api_client()).patch_namespaced_pod(
            pod.metadata.name, NS, {"metadata": {"annotations": {EXIT_ANNOTATION: "succeed"}}}
        )


def test_a_job_is_admitted_whole_and_the_next_waits_with_no_pod(control_plane, queue) -> None:
    plane = control_plane
    create(plane, NS, gpu_job("first"))
    wait_phase(plane, NS, "first", "Running", 90)
    assert len(live_pods(plane, NS, "first")) == 2
    second_pods = PodWatch(plane, NS, "second")
    create(plane, NS, gpu_job("second"))
    s = wait_phase(plane, NS, "second", "Queued", 60)
    queued = next(c for c in s["conditions"] if c["type"] == "Queued")
    assert queued["reason"] == "Pending" and "insufficient unused quota for nvidia.com/gpu" in queued["message"], queued
    assert queued["message"].startswith(f"queue {QUEUE}: ")
    time.sleep(5)  # and it stays so
    assert status(plane, NS, "second")["phase"] == "Queued" and not second_pods.seen
    # Kueue's own view: one workload admitted, one waiting.
    lq = client.CustomObjectsApi(plane.api_client()).get_namespaced_custom_object(*KUEUE, NS, "localqueues", QUEUE)
    assert (lq["status"]["admittedWorkloads"], lq["status"]["pendingWorkloads"]) == (1, 1)

    finish(plane, "first")
    wait_phase(plane, NS, "first", "Succeeded", 60)
    s = wait_phase(plane, NS, "second", "Running", 120)
    assert s["admittedTime"] and len(live_pods(plane, NS, "second")) == 2
    assert len(second_pods.stop()) == 2  # its pods appeared only once it was admitted, both at once
    finish(plane, "second")
    wait_phase(plane, NS, "second", "Succeeded", 60)


def test_the_operators_cache_and_its_direct_reads_find_the_same_workload(control_plane, queue) -> None:
    """The operator reads a job's children from its cache, or, without one, from the API: both find the
    Workload Kueue made for the job's JobSet, and only that one."""
    from concurrent.futures import ThreadPoolExecutor

    from kuberl.operator.api import GROUP, PLURAL, VERSION
    from kuberl.operator.control.child_cache import ChildCache
    from kuberl.operator.control.child_reader import ChildReader
    from kuberl.operator.validation.manifest import parse_rljob
    from kuberl.operator.control.reconcile.reading import admitted

    plane = control_plane
    create(plane, NS, gpu_job("read"))
    wait_phase(plane, NS, "read", "Running", 90)
    job = parse_rljob(client.CustomObjectsApi(plane.api_client()).get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "read"), "read")
    cache = ChildCache(plane.api_client(), (NS,))
    cache.start(lambda *change: None)
    try:
        assert cache.wait_synced(30), "the cache did not list its kinds"
        with ThreadPoolExecutor(4) as io:
            cached = ChildReader(plane.api_client(), io, cache).observe(job, NS, "read")
            direct = ChildReader(plane.api_client(), io).observe(job, NS, "read")
    finally:
        cache.stop()

    def names(objects: list[dict[str, Any]]) -> list[str]:
        return sorted(o["metadata"]["name"] for o in objects)

    assert len(direct.workloads) == 1 and admitted(direct.workloads)
    assert names(cached.workloads) == names(direct.workloads)
    assert names(cached.jobsets) == names(direct.jobsets) == ["read"]
    assert names(cached.pods) == names(direct.pods) and len(direct.pods) == 2
    finish(plane, "read")
    wait_phase(plane, NS, "read", "Succeeded", 60)


def test_roles_that_fit_alone_but_not_together_are_not_admitted_at_all(control_plane, queue) -> None:
    """The actor (16 GPUs) fits the queue; actor and critic (24) do not. Admitting Jobs one by one would start
    the actor and hold its GPUs while the critic waits; the job's one Workload is never admitted."""
    plane = control_plane
    seen = PodWatch(plane, NS, "too-big")
    create(plane, NS, gpu_job("too-big", critic_pods=1))
    s = wait_phase(plane, NS, "too-big", "Queued", 60)
    time.sleep(10)
    s = status(plane, NS, "too-big")
    queued = next(c for c in s["conditions"] if c["type"] == "Queued")
    assert s["phase"] == "Queued" and "nvidia.com/gpu" in queued["message"], queued
    assert not seen.stop() and not pods(plane, NS, "kuberl.dev/job=too-big")
    [jobset] = [j for j in jobsets(plane, NS) if j["metadata"]["name"] == "too-big"]
    assert jobset["spec"]["suspend"] is True
    client.CustomObjectsApi(plane.api_client()).delete_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rljobs", "too-big")


def separate_job(name: str, rollout_gpus: int) -> dict[str, Any]:
    """One 8-GPU actor pod and a fleet of two rollout pods of `rollout_gpus` GPUs each (rollout.placement: separate)."""
    doc = gpu_job(name, actor_pods=1)
    doc["spec"]["algorithm"]["async"] = {"maxStaleness": 1}
    doc["spec"]["rollout"]["placement"] = "separate"
    doc["spec"]["roles"]["rollout"] = {"replicas": 2, "gpusPerReplica": rollout_gpus}
    return doc


def test_the_rollout_fleet_is_a_podset_of_the_jobs_one_workload(control_plane, queue) -> None:
    """Kueue counts the rollout pods with the trainers: 8 + 2 x 4 GPUs fit the queue's 16 and start together;
    8 + 2 x 8 do not, and not even the actor starts."""
    plane = control_plane
    objects = client.CustomObjectsApi(plane.api_client())
    seen = PodWatch(plane, NS, "fleet-big")
    create(plane, NS, separate_job("fleet-big", rollout_gpus=8))
    wait_phase(plane, NS, "fleet-big", "Queued", 60)
    time.sleep(5)
    assert status(plane, NS, "fleet-big")["phase"] == "Queued" and not seen.stop()
    objects.delete_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rljobs", "fleet-big")

    create(plane, NS, separate_job("fleet", rollout_gpus=4))
    s = wait_phase(plane, NS, "fleet", "Running", 120)
    assert (s["roles"]["actor"]["ready"], s["roles"]["rollout"]["ready"]) == (1, 2)
    uid = next(j for j in jobsets(plane, NS) if j["metadata"]["name"] == "fleet")["metadata"]["uid"]
    [workload] = objects.list_namespaced_custom_object(*KUEUE, NS, "workloads", label_selector=f"kueue.x-k8s.io/job-uid={uid}")["items"]
    podsets = {p["name"]: p for p in workload["spec"]["podSets"]}
    assert {name: p["count"] for name, p in podsets.items()} == {"actor": 1, "rollout": 2}
    [container] = podsets["rollout"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    finish(plane, "fleet")
    wait_phase(plane, NS, "fleet", "Succeeded", 60)


def test_a_higher_priority_job_preempts_and_the_preempted_one_waits_then_comes_back(control_plane, queue) -> None:
    plane = control_plane
    create(plane, NS, gpu_job("low", priority="rl-low"))
    wait_phase(plane, NS, "low", "Running", 90)
    create(plane, NS, gpu_job("high", priority="rl-high"))
    s = wait_phase(plane, NS, "low", "Queued", 90, preemptions=1)
    assert s["restarts"] == 0  # a preemption is no failure
    queued = next(c for c in s["conditions"] if c["type"] == "Queued")
    assert queued["reason"] == "Preempted" and "evicted by Kueue" in queued["message"], queued
    wait_phase(plane, NS, "high", "Running", 90)
    from kuberl.operator.testing.waiting import eventually

    eventually(lambda: not live_pods(plane, NS, "low"), 60, "the preempted job's pods to go")
    finish(plane, "high")
    wait_phase(plane, NS, "high", "Succeeded", 60)
    s = wait_phase(plane, NS, "low", "Running", 120)
    assert (s["preemptions"], s["restarts"]) == (1, 0)
    events = client.CoreV1Api(plane.api_client()).list_namespaced_event(NS, field_selector="involvedObject.name=low").items
    assert any(e.reason == "Preempted" for e in events)
    finish(plane, "low")
    wait_phase(plane, NS, "low", "Succeeded", 60)


def test_an_operator_killed_while_a_job_is_admitted_converges_to_one_workload(control_plane, queue, operator) -> None:
    plane = control_plane
    names = [f"crash-{i}" for i in range(3)]
    for name in names:
        create(plane, NS, gpu_job(name, actor_pods=1))
    time.sleep(0.3)
    operator.kill()  # somewhere between creating the JobSets and Kueue admitting them
    operator.start()
    objects = client.CustomObjectsApi(plane.api_client())
    from kuberl.operator.testing.waiting import eventually

    def settled() -> bool:
        phases = sorted(status(plane, NS, n).get("phase") or "" for n in names)
        return phases == ["Queued", "Running", "Running"]

    eventually(settled, 120, "two jobs running and one queued")  # 3 jobs of 8 GPUs, 16 in the queue
    for name in names:
        assert len([j for j in jobsets(plane, NS) if j["metadata"]["name"] == name]) == 1
        uid = next(j for j in jobsets(plane, NS) if j["metadata"]["name"] == name)["metadata"]["uid"]
        workloads = objects.list_namespaced_custom_object(*KUEUE, NS, "workloads", label_selector=f"kueue.x-k8s.io/job-uid={uid}")
        assert len(workloads["items"]) == 1, json.dumps([w["metadata"]["name"] for w in workloads["items"]])
    for name in names:
        objects.delete_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rljobs", name)
