"""bench/operator: 100 RLJobs through one Kueue ClusterQueue, against 100 JobSets created directly.

Issue 28's must-show 5. One control plane (kwok nodes, which run a pod as soon as it is bound) with
the real Kueue and JobSet managers (kuberl.operator.testing.scheduling) and `kuberl operator` as a
process. One ClusterQueue with quota for every job, a LocalQueue of it in each namespace. Both sides
make the same pods: per job one replicated job of one indexed Job with 2 pods of 1 CPU and 1 GiB,
labelled with the LocalQueue, so that Kueue admits each job whole as one Workload.

- baseline: 100 JobSets, suspended, created directly (what Kueue and JobSet alone need);
- ours: 100 RLJobs naming the queue; the operator adds its Service, ConfigMaps, ServiceAccount, Role,
  RoleBinding, the JobSet and the status.

First one job of each kind warms the managers, the operator and the garbage collector up; then the
baseline runs, is deleted, and ours runs. Each side's clock starts before its first create and stops
when a watch has seen every one of its pods Running. Reported: both times and their ratio (goal at
most 1.2), the operator's reconcile p50/p99 from its own histogram (goal p99 under 1 s) and its count,
the time until every RLJob's status says Running, the peak resident memory (VmHWM) of the operator,
Kueue and JobSet, and the CPU seconds that each process of the plane used during each side (the
machine's load average too: on a shared machine, other work slows both sides), and the API server's
requests during each side by verb and resource with the seconds it spent on them (apiserver_usage.py).
--profile-seconds N also writes the API server's CPU profile over the first N seconds of our side into
the work folder (with --keep).

    .venv/bin/python bench/operator/run.py [--jobs 100] [--out bench/results/operator.json] [--keep --profile-seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from apiserver_usage import profile_in_background, request_totals, requests_between
from kubernetes import client, watch

from kuberl.operator.testing.control_plane import NodePool, start_control_plane
from kuberl.operator.testing.operator_process import OperatorProcess
from kuberl.operator.testing.scheduling import QUEUE_LABEL, scheduling_root, start_schedulers, wait_for_garbage_collector
from kuberl.operator.testing.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
RLJOBS = ("kuberl.dev", "v1alpha1")
QUEUE = "bench"
POOL = "bench"
PODS_PER_JOB = 2
REQUESTS = {"cpu": "1", "memory": "1Gi"}
CREATE_THREADS = 8


# --- the objects ---------------------------------------------------------------------------------


def queue_objects(namespaces: list[str]) -> list[dict[str, Any]]:
    """A flavor over the bench's kwok pool, one ClusterQueue with room for every job of both sides, a LocalQueue per namespace."""
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": POOL},
            "spec": {"nodeLabels": {"kuberl.dev/pool": POOL}},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": POOL,
                                "resources": [{"name": "cpu", "nominalQuota": "1000"}, {"name": "memory", "nominalQuota": "4Ti"}],
                            }
                        ],
                    }
                ],
            },
        },
        *(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": ns},
                "spec": {"clusterQueue": QUEUE},
            }
            for ns in namespaces
        ),
    ]


def rljob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": "/data/m"},
            "data": {"train": {"path": "/data/d.jsonl"}},
            "volumes": [{"name": "data", "emptyDir": {}}],
            "algorithm": {"name": "grpo"},
            "rollout": {"samplesPerPrompt": 4},
            "reward": {"rules": [{"name": "math_answer"}]},
            "roles": {
                "actor": {
                    "replicas": PODS_PER_JOB,
                    "resources": {"requests": dict(REQUESTS)},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            },
            "trainer": {"totalSteps": 1, "promptsPerStep": 4},
            "runPolicy": {"scheduling": {"queueName": QUEUE}},
        },
    }


def jobset(name: str) -> dict[str, Any]:
    """What a user writes for the same pods: one replicated job of one indexed Job of 2 pods, in the queue."""
    pod = {
        "restartPolicy": "Never",
        "containers": [{"name": "trainer", "image": "registry.invalid/trainer:bench", "resources": {"requests": dict(REQUESTS)}}],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE}},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {
                    "name": "actor",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "completionMode": "Indexed",
                            "completions": PODS_PER_JOB,
                            "parallelism": PODS_PER_JOB,
                            "backoffLimit": 0,
                            "template": {"spec": pod},
                        }
                    },
                }
            ],
        },
    }


# --- watching --------------------------------------------------------------------------------------


class Watcher:
    """Objects of a namespace seen in a state, from a watch (raw JSON, not deserialized) in a thread."""

    def __init__(self, list_call: Callable, args: tuple, done: Callable[[dict], bool]):
        self.seen: dict[str, float] = {}
        """Name: when it was first seen in the state (time.monotonic())."""
        self.changed = threading.Condition()
        self._watch = watch.Watch()
        self._stopped = False

        def run() -> None:
            while not self._stopped:
                try:
                    for event in self._watch.stream(list_call, *args, deserialize=False):
                        obj = event.get("object") or {}
                        if event.get("type") in ("ADDED", "MODIFIED") and done(obj):
                            with self.changed:
                                self.seen.setdefault(obj["metadata"]["name"], time.monotonic())
                                self.changed.notify_all()
                except Exception:  # noqa: BLE001 - a broken stream is watched again; stop() breaks it on purpose
                    if not self._stopped:
                        time.sleep(0.2)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.seen) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.seen)} of {count} seen in {timeout:.0f} s")
                self.changed.wait(min(left, 1.0))

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def running_pod(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def running_rljob(job: dict) -> bool:
    return (job.get("status") or {}).get("phase") == "Running"


# --- processes --------------------------------------------------------------------------------------


def proc_status(pid: int, field: str) -> int:
    """A /proc/PID/status figure in bytes (VmHWM, VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process (its threads included) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets."""
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_bound, prev_count = bound, count
    return prev_bound


def reconcile_buckets(metrics_text: str) -> list[tuple[float, float]]:
    out = []
    for line in metrics_text.splitlines():
        if line.startswith("kuberl_operator_reconcile_duration_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    return sorted(out)


def minus(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The reconciles between two scrapes of the histogram."""
    return [(b, a - dict(before).get(b, 0.0)) for b, a in after]


# --- the run ------------------------------------------------------------------------------------------


def run_side(plane, namespace: str, names: list[str], create: Callable[[str], Any], timeout: float, trace: dict | None = None) -> float:
    """Create every job, return the seconds until a watch saw all their pods Running. `trace` gets when
    each job was created and each pod ran (seconds from the start)."""
    core = client.CoreV1Api(plane.api_client())
    pods = Watcher(core.list_namespaced_pod, (namespace,), running_pod)
    created: dict[str, float] = {}

    def timed(name: str) -> None:
        create(name)
        created[name] = time.monotonic()

    try:
        started = time.monotonic()
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            list(pool.map(timed, names))
        pods.wait_for(PODS_PER_JOB * len(names), timeout)
        if trace is not None:
            trace.update(
                started=started,
                created={n: t - started for n, t in created.items()},
                running={n: t - started for n, t in pods.seen.items()},
            )
        return time.monotonic() - started
    finally:
        pods.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=RESULTS / "operator.json")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) after the run")
    parser.add_argument("--profile-seconds", type=int, default=0, help="profile the API server over our side's first N seconds")
    args = parser.parse_args()
    bin_dir = Path(
        subprocess.run(["bash", str(REPO / "scripts" / "kube-binaries.sh")], check=True, capture_output=True, text=True).stdout.strip()
    )
    root = scheduling_root(REPO / "scripts" / "scheduling-binaries.sh")
    work = Path(tempfile.mkdtemp(prefix="kuberl-bench-operator-"))
    # 8 nodes of 64 CPUs and 110 pods: room for both sides' 400 pods at once.
    plane = start_control_plane(
        bin_dir, work / "plane", pools=(NodePool(POOL, count=8, cpu="64", memory="512Gi"),), profiling=args.profile_seconds > 0
    )
    sched = operator = None
    try:
        sched = start_schedulers(plane, work / "schedulers", root)
        plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "kuberl.dev_rljobs.yaml"))
        eventually(
            lambda: (
                plane.kubectl("wait", "--for=condition=Established", "crd/rljobs.kuberl.dev", "--timeout=30s", check=False).returncode == 0
            ),
            60,
            "the RLJob CRD",
        )
        api = plane.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespaces = ["warmup", "baseline", "ours"]
        for ns in namespaces:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        plane.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(o) for o in queue_objects(namespaces)))

        def queue_active() -> bool:
            cq = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", QUEUE)
            return any(c["type"] == "Active" and c["status"] == "True" for c in cq.get("status", {}).get("conditions", []))

        eventually(queue_active, 60, "the ClusterQueue Active")
        wait_for_garbage_collector(plane)  # deleting the baseline's JobSets must take their pods and Workloads

        operator = OperatorProcess(plane.kubeconfig, work / "operator.log")
        operator.start()

        def create_jobset(ns: str) -> Callable[[str], Any]:
            return lambda n: custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", jobset(n))

        def create_rljob(ns: str) -> Callable[[str], Any]:
            return lambda n: custom.create_namespaced_custom_object(*RLJOBS, ns, "rljobs", rljob(n))

        # Warm-up: one job of each kind, so that neither side pays for first connections and caches.
        run_side(plane, "warmup", ["warm-js"], create_jobset("warmup"), 120)
        run_side(plane, "warmup", ["warm-rl"], create_rljob("warmup"), 120)
        custom.delete_namespaced_custom_object(*RLJOBS, "warmup", "rljobs", "warm-rl")
        custom.delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "warmup", "jobsets", "warm-js", propagation_policy="Background"
        )
        eventually(lambda: not core.list_namespaced_pod("warmup").items, 120, "the warm-up's pods to go")

        names = [f"job-{i:03d}" for i in range(args.jobs)]
        pids = {
            "operator": operator.proc.pid,
            **{k: p.pid for k, p in sched.processes.items()},
            **{k: p.pid for k, p in plane.processes.items()},
        }
        cpu_before = {k: cpu_seconds(p) for k, p in pids.items()}
        requests_before = request_totals(plane)
        traces: dict[str, dict] = {"baseline": {}, "ours": {}}
        baseline_seconds = run_side(plane, "baseline", names, create_jobset("baseline"), 900, traces["baseline"])
        cpu_baseline = {k: round(cpu_seconds(p) - cpu_before[k], 1) for k, p in pids.items()}
        requests_baseline = requests_between(requests_before, request_totals(plane))
        kueue_rss_baseline = proc_status(sched.processes["kueue"].pid, "VmRSS")
        custom.delete_collection_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "baseline", "jobsets", propagation_policy="Background"
        )
        eventually(lambda: not core.list_namespaced_pod("baseline").items, 300, "the baseline's pods to go")
        eventually(
            lambda: not custom.list_namespaced_custom_object(*KUEUE, "baseline", "workloads")["items"],
            120,
            "the baseline's Workloads to go",
        )

        buckets_before = reconcile_buckets(operator.metrics())
        cpu_before = {k: cpu_seconds(p) for k, p in pids.items()}
        requests_before = request_totals(plane)
        if args.profile_seconds:
            profiling = profile_in_background(plane, args.profile_seconds, work / "apiserver-ours.pprof")
        rljobs = Watcher(custom.list_namespaced_custom_object, (*RLJOBS, "ours", "rljobs"), running_rljob)
        started = time.monotonic()
        ours_seconds = run_side(plane, "ours", names, create_rljob("ours"), 900, traces["ours"])
        rljobs.wait_for(len(names), 300)
        status_seconds = time.monotonic() - started
        rljobs.stop()
        cpu_ours = {k: round(cpu_seconds(p) - cpu_before[k], 1) for k, p in pids.items()}
        requests_ours = requests_between(requests_before, request_totals(plane))
        if args.profile_seconds:
            profiling.join()
        load = os.getloadavg()
        buckets = minus(reconcile_buckets(operator.metrics()), buckets_before)
        peak = {k: proc_status(p, "VmHWM") for k, p in pids.items()}
        rss_now = {k: proc_status(p, "VmRSS") for k, p in pids.items()}
    finally:
        if operator is not None:
            operator.stop()
        if sched is not None:
            sched.stop()
        plane.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    mib = 1024 * 1024
    result = {
        "benchmark": "operator",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "jobs": args.jobs,
        "pods": PODS_PER_JOB * args.jobs,
        "queue": f"one Kueue ClusterQueue (cpu 1000, memory 4Ti), Kueue {root.name}; pods of 1 CPU and 1 GiB on kwok nodes",
        "baseline_jobsets_all_running_seconds": round(baseline_seconds, 2),
        "rljobs_all_running_seconds": round(ours_seconds, 2),
        "ratio_rljobs_over_jobsets": round(ours_seconds / baseline_seconds, 2),
        "rljobs_status_running_seconds": round(status_seconds, 2),
        "reconciles": int(buckets[-1][1]),
        "reconcile_p50_seconds": round(histogram_quantile(0.5, buckets), 4),
        "reconcile_p99_seconds": round(histogram_quantile(0.99, buckets), 4),
        "operator_peak_rss_mib": round(peak["operator"] / mib, 1),
        "kueue_peak_rss_mib": round(peak["kueue"] / mib, 1),
        "kueue_rss_after_baseline_mib": round(kueue_rss_baseline / mib, 1),
        "kueue_rss_after_rljobs_mib": round(rss_now["kueue"] / mib, 1),
        "jobset_peak_rss_mib": round(peak["jobset"] / mib, 1),
        # Until all pods ran (ours: until every status said Running): the control plane's processes and ours.
        "cpu_seconds_during_baseline": cpu_baseline,
        "cpu_seconds_during_rljobs": cpu_ours,
        # The API server's requests during each side (not watches), most time-consuming first.
        "api_requests_during_baseline": requests_baseline,
        "api_requests_during_rljobs": requests_ours,
        "load_average_1_5_15_at_end": [round(x, 2) for x in load],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if args.keep:
        (work / "trace.json").write_text(json.dumps(traces))
        print(f"logs and trace.json: {work}")


if __name__ == "__main__":
    main()
