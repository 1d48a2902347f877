"""A real Kueue (v0.17) and a real JobSet controller (v0.12) on the test control plane.

Gang admission of JobSets against a ClusterQueue's nvidia.com/gpu quota: a JobSet is admitted whole
or not at all, a second one waits suspended with no pods until the first is gone, and one that no
amount of waiting can fit is never admitted. The plane is this module's own: Kueue's webhooks
(`failurePolicy: Fail` on Jobs) must not outlive it on the session's shared plane.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kuberl.operator.testing.control_plane import ControlPlaneError, NodePool, start_control_plane
from kuberl.operator.testing.scheduling import (
    JOBSET_NAME_LABEL, QUEUE_LABEL, scheduling_root, start_schedulers, wait_for_garbage_collector,
)
from kuberl.operator.testing.waiting import eventually

SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "scheduling-binaries.sh"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
GPU = "nvidia.com/gpu"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Two untainted 8-GPU kwok nodes: 16 GPUs of capacity, so only the ClusterQueue's quota of 8 limits.
POOLS = (NodePool(name="gpu", count=2, gpus=8), NodePool(name="cpu", count=1))


@pytest.fixture(scope="module")
def plane(kube_binaries_dir, tmp_path_factory):
    try:
        plane = start_control_plane(kube_binaries_dir, tmp_path_factory.mktemp("sched-plane"), pools=POOLS)
    except ControlPlaneError as exc:
        pytest.fail(f"the test control plane did not start: {exc}", pytrace=False)
    yield plane
    plane.stop()


@pytest.fixture(scope="module")
def schedulers(plane, tmp_path_factory):
    try:
        root = scheduling_root(SCRIPT)
        sched = start_schedulers(plane, tmp_path_factory.mktemp("schedulers"), root, visibility=True)
        # Deleting a JobSet must free its quota: its Workload goes by owner reference.
        gc_seconds = wait_for_garbage_collector(plane)
    except ControlPlaneError as exc:
        pytest.fail(f"Kueue and JobSet did not start: {exc}", pytrace=False)
    print(f"\nstartup (spawn -> readyz): {', '.join(f'{k} {v:.1f} s' for k, v in sched.startup_seconds.items())}; "
          f"garbage collector following JobSets after {gc_seconds:.1f} s more")
    yield sched
    print(f"\nRSS at the end: {', '.join(f'{k} {sched.rss_bytes(k) / 2**20:.0f} MiB' for k in sched.processes)}")
    sched.stop()


@pytest.fixture
def make_queue(plane, schedulers):
    """make_queue(preemption=None): a fresh namespace with a LocalQueue `gpu` on its own ClusterQueue
    (8 GPUs, 64 CPUs, 512 GiB, `preemption` as its spec.preemption); returns the namespace."""
    admin = plane.api_client()
    core, objects = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    namespaces = []

    def make(preemption: dict | None = None) -> str:
        suffix = uuid.uuid4().hex[:6]
        namespace, cq = f"sched-{suffix}", f"gpu-{suffix}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        namespaces.append(namespace)
        _ensure(lambda: objects.create_cluster_custom_object(*KUEUE, "resourceflavors", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}}))
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", GPU],
                "flavors": [{"name": "default", "resources": [
                    {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "512Gi"},
                    {"name": GPU, "nominalQuota": "8"},
                ]}],
            }],
        }
        if preemption:
            spec["preemption"] = preemption
        objects.create_cluster_custom_object(*KUEUE, "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq}, "spec": spec})
        objects.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {"clusterQueue": cq},
        })
        eventually(lambda: _condition(objects.get_cluster_custom_object(*KUEUE, "clusterqueues", cq), "Active") == "True",
                   30, f"ClusterQueue {cq} Active")
        return namespace

    yield make
    for namespace in namespaces:
        core.delete_namespace(namespace)


@pytest.fixture
def queue(make_queue) -> str:
    return make_queue()


def _ensure(create) -> None:
    """Create, unless it already exists."""
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


def jobset(name: str, gpus_per_replicated_job: list[int], queue: str = "gpu", priority_class: str | None = None,
           grace_seconds: int = 30) -> dict[str, Any]:
    """A JobSet with one single-pod Job per entry, each pod asking for that many GPUs."""
    labels = {QUEUE_LABEL: queue}
    if priority_class:
        labels[PRIORITY_LABEL] = priority_class
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicatedJobs": [
            {"name": f"rj{i}", "replicas": 1, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace_seconds, "containers": [{
                    "name": "main", "image": "registry.invalid/trainer:none",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi", GPU: str(g)}, "limits": {GPU: str(g)}},
                }]}},
            }}}
            for i, g in enumerate(gpus_per_replicated_job)
        ]},
    }


def _condition(obj: dict, kind: str, field: str = "status") -> str | None:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            return cond[field]
    return None


def _workload(objects: client.CustomObjectsApi, namespace: str, jobset_name: str) -> dict | None:
    for wl in objects.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]:
        if any(o["kind"] == "JobSet" and o["name"] == jobset_name for o in wl["metadata"].get("ownerReferences", [])):
            return wl
    return None


def _pods(core: client.CoreV1Api, namespace: str, jobset_name: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME_LABEL}={jobset_name}").items


def _admitted(objects, namespace: str, name: str) -> dict | None:
    wl = _workload(objects, namespace, name)
    return wl if wl and _condition(wl, "Admitted") == "True" else None


def _pending(objects, namespace: str, name: str) -> dict | None:
    wl = _workload(objects, namespace, name)
    return wl if wl and _condition(wl, "QuotaReserved") == "False" and _condition(wl, "QuotaReserved", "reason") == "Pending" else None


def _running_on_kwok(core, namespace: str, name: str, count: int) -> list | None:
    pods = _pods(core, namespace, name)
    if len(pods) == count and all(p.status.phase == "Running" and p.spec.node_name for p in pods):
        return pods
    return None


def _local_queue_counts(objects, namespace: str) -> tuple[int, int]:
    status = objects.get_namespaced_custom_object(*KUEUE, namespace, "localqueues", "gpu").get("status", {})
    return status.get("pendingWorkloads", 0), status.get("admittedWorkloads", 0)


def _stays_without_pods(core, objects, namespace: str, name: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert _pods(core, namespace, name) == [], f"{name} has pods"
        assert _admitted(objects, namespace, name) is None, f"{name} was admitted"
        js = objects.get_namespaced_custom_object(*JOBSET, namespace, "jobsets", name)
        assert js["spec"].get("suspend") is True, f"{name} is not suspended"
        time.sleep(0.5)


def test_kueue_without_visibility_server(kube_binaries_dir, tmp_path) -> None:
    # The default: Kueue in a mount namespace with only /etc overlaid (no chroot), on a plane of its own.
    plane = start_control_plane(kube_binaries_dir, tmp_path / "plane", pools=(NodePool(name="gpu", count=1, gpus=8),))
    try:
        sched = start_schedulers(plane, tmp_path / "schedulers", scheduling_root(SCRIPT))
        try:
            assert "kueue-visibility" not in sched.ports
            created = client.CustomObjectsApi(plane.api_client()).create_namespaced_custom_object(
                *JOBSET, "default", "jobsets", jobset("probe", [8]), dry_run="All")
            assert created["spec"]["suspend"] is True
        finally:
            sched.stop()
    finally:
        plane.stop()


def test_webhooks_answer_and_suspend_queued_jobsets(plane, schedulers, queue) -> None:
    objects = client.CustomObjectsApi(plane.api_client())
    created = objects.create_namespaced_custom_object(*JOBSET, queue, "jobsets", jobset("probe", [4, 4]), dry_run="All")
    # Kueue's mutating webhook suspends a queued JobSet; JobSet's defaults it (e.g. its success policy).
    assert created["spec"]["suspend"] is True
    assert created["spec"]["successPolicy"]["operator"] == "All"
    # v1beta1 is still served: the API server converts through Kueue's conversion webhook.
    old = objects.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", queue, "localqueues", "gpu")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1" and old["spec"]["clusterQueue"].startswith("gpu-")


def test_second_gang_waits_for_quota_and_runs_when_first_is_deleted(plane, schedulers, queue) -> None:
    admin = plane.api_client()
    objects, core = client.CustomObjectsApi(admin), client.CoreV1Api(admin)

    objects.create_namespaced_custom_object(*JOBSET, queue, "jobsets", jobset("first", [4, 4]))
    t0 = time.monotonic()
    wl = eventually(lambda: _admitted(objects, queue, "first"), 60, "the first JobSet's Workload Admitted")
    pods = eventually(lambda: _running_on_kwok(core, queue, "first", 2), 60, "the first JobSet's 2 pods Running")
    print(f"\nfirst JobSet: create -> 2 pods Running in {time.monotonic() - t0:.1f} s")
    assert {p.spec.node_name.rsplit("-", 1)[0] for p in pods} == {"gpu"}
    assert [ps["count"] for ps in wl["spec"]["podSets"]] == [1, 1]

    objects.create_namespaced_custom_object(*JOBSET, queue, "jobsets", jobset("second", [4, 4]))
    wl = eventually(lambda: _pending(objects, queue, "second"), 60, "the second JobSet's Workload pending")
    message = next(c["message"] for c in wl["status"]["conditions"] if c["type"] == "QuotaReserved")
    print(f"second JobSet pending: {message!r}")
    assert "insufficient unused quota" in message and GPU in message
    _stays_without_pods(core, objects, queue, "second")
    # The queue position is only in Kueue's visibility API, not on the Workload.
    pending = schedulers.pending_workloads(namespace=queue, local_queue="gpu")
    assert [(p["metadata"]["name"], p["positionInLocalQueue"], p["positionInClusterQueue"]) for p in pending] == [
        (wl["metadata"]["name"], 0, 0)]
    assert wl["status"].get("requeueState") is None  # set only by waitForPodsReady and admission-check retries
    eventually(lambda: _local_queue_counts(objects, queue) == (1, 1), 30, "LocalQueue: 1 pending, 1 admitted")

    objects.delete_namespaced_custom_object(*JOBSET, queue, "jobsets", "first")
    t0 = time.monotonic()
    eventually(lambda: _admitted(objects, queue, "second"), 90, "the second JobSet admitted after the first is gone")
    eventually(lambda: _running_on_kwok(core, queue, "second", 2), 60, "the second JobSet's 2 pods Running")
    print(f"second JobSet: delete first -> 2 pods Running in {time.monotonic() - t0:.1f} s")


def test_gang_larger_than_quota_is_never_admitted(plane, schedulers, queue) -> None:
    # 8 and 4 GPUs: each Job would fit the quota of 8 alone, the JobSet (12) never does.
    admin = plane.api_client()
    objects, core = client.CustomObjectsApi(admin), client.CoreV1Api(admin)
    objects.create_namespaced_custom_object(*JOBSET, queue, "jobsets", jobset("too-big", [8, 4]))
    wl = eventually(lambda: _pending(objects, queue, "too-big"), 60, "the 8+4 JobSet's Workload pending")
    message = next(c["message"] for c in wl["status"]["conditions"] if c["type"] == "QuotaReserved")
    print(f"\n8+4 JobSet pending: {message!r}")
    assert GPU in message
    _stays_without_pods(core, objects, queue, "too-big", seconds=8.0)


def test_higher_priority_gang_preempts_a_running_one(plane, schedulers, make_queue) -> None:
    namespace = make_queue(preemption={"withinClusterQueue": "LowerPriority"})
    admin = plane.api_client()
    objects, core = client.CustomObjectsApi(admin), client.CoreV1Api(admin)
    for name, value in (("sched-low", 10), ("sched-high", 1000)):
        _ensure(lambda: objects.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}))

    objects.create_namespaced_custom_object(*JOBSET, namespace, "jobsets", jobset("low", [4, 4], priority_class="sched-low", grace_seconds=45))
    eventually(lambda: _admitted(objects, namespace, "low"), 60, "the low-priority JobSet admitted")
    eventually(lambda: _running_on_kwok(core, namespace, "low", 2), 60, "the low-priority JobSet's pods Running")

    deletions: dict[str, int | None] = {}  # pod -> deletionGracePeriodSeconds when its deletion began
    stream = watch.Watch()

    def record() -> None:
        try:
            for event in stream.stream(core.list_namespaced_pod, namespace, label_selector=f"{JOBSET_NAME_LABEL}=low",
                                       timeout_seconds=90):
                pod = event["object"]
                if pod.metadata.deletion_timestamp and pod.metadata.name not in deletions:
                    deletions[pod.metadata.name] = pod.metadata.deletion_grace_period_seconds
                if len(deletions) == 2:
                    return
        except Exception as exc:  # the assertion on `deletions` below tells what was missed
            deletions.setdefault("watch error", repr(exc))

    watcher = threading.Thread(target=record, daemon=True)
    watcher.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    objects.create_namespaced_custom_object(*JOBSET, namespace, "jobsets", jobset("high", [4, 4], priority_class="sched-high"))
    evicted = eventually(lambda: (wl := _workload(objects, namespace, "low")) and _condition(wl, "Evicted") == "True" and wl,
                         60, "the low-priority Workload Evicted")
    assert _condition(evicted, "Evicted", "reason") == "Preempted"
    assert _condition(evicted, "Preempted", "reason") == "InClusterQueue"
    # Then Kueue's JobSet reconciler stops the JobSet: spec.suspend true.
    eventually(lambda: objects.get_namespaced_custom_object(*JOBSET, namespace, "jobsets", "low")["spec"]["suspend"] is True,
               30, "the low-priority JobSet suspended")
    eventually(lambda: _pods(core, namespace, "low") == [], 60, "the low-priority JobSet's pods gone")
    gone = time.monotonic() - t0
    eventually(lambda: _admitted(objects, namespace, "high"), 60, "the high-priority JobSet admitted")
    eventually(lambda: _running_on_kwok(core, namespace, "high", 2), 60, "the high-priority JobSet's pods Running")
    print(f"\npreemption: high created -> low's pods gone {gone:.1f} s -> high's pods Running {time.monotonic() - t0:.1f} s")
    watcher.join(timeout=10)
    # JobSet suspends its Jobs; the Job controller deletes their pods with the pods' own grace period.
    assert deletions and set(deletions.values()) == {45}, deletions
    low = _workload(objects, namespace, "low")
    print("low Workload after preemption:", [(c["type"], c["status"], c["reason"]) for c in low["status"]["conditions"]],
          low["status"].get("requeueState"))
    assert _condition(low, "QuotaReserved") == "False" and _condition(low, "Requeued") == "True"
