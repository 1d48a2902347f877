"""bench/operator: 100 RLJobs applied at once, against 100 plain indexed Jobs on the same control plane.

Both sides make the same 200 pods (two per job) on a real control plane with kwok nodes. The
baseline is what Kubernetes alone needs to get those pods Running; ours adds the operator's work
(Service, ConfigMaps, RBAC, Jobs, status). Reported: seconds until all are Running for each, their
ratio, and the operator's reconcile p50/p99 read from its own histogram.

    .venv/bin/python bench/operator/run.py [--jobs 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from kubernetes import client

from kuberl.operator.testing.control_plane import NodePool, start_control_plane
from kuberl.operator.ports import free_port

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def rljob(name: str) -> dict:
    return {
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name},
        "spec": {
            "model": {"path": "/models/m"}, "data": {"train": {"path": "/d.jsonl"}},
            "algorithm": {"name": "grpo"}, "rollout": {"samplesPerPrompt": 4},
            "reward": {"rules": [{"name": "math_answer"}]},
            "roles": {"actor": {"replicas": 2}}, "trainer": {"totalSteps": 1, "promptsPerStep": 4},
        },
    }


def plain_job(name: str) -> dict:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0,
                 "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}},
    }


def wait_until(check, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError("benchmark did not converge")
        time.sleep(0.25)
    return time.monotonic() - started


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    bin_dir = Path(subprocess.run(["bash", str(REPO / "scripts" / "kube-binaries.sh")], check=True,
                                  capture_output=True, text=True).stdout.strip())
    work = Path(tempfile.mkdtemp(prefix="kuberl-bench-operator-"))
    plane = start_control_plane(bin_dir, work / "plane", pools=(NodePool("cpu", count=4),))
    operator = None
    try:
        plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "kuberl.dev_rljobs.yaml"))
        plane.kubectl("wait", "--for=condition=Established", "crd/rljobs.kuberl.dev")
        core = client.CoreV1Api(plane.api_client())
        for ns in ("baseline", "ours"):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        names = [f"job-{i:03d}" for i in range(args.jobs)]

        # Baseline: Kubernetes alone, the same pods.
        batch = client.BatchV1Api(plane.api_client())
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: batch.create_namespaced_job("baseline", plain_job(n)), names))

        def baseline_running() -> bool:
            pods = core.list_namespaced_pod("baseline").items
            return sum(p.status.phase == "Running" for p in pods) == 2 * len(names)

        wait_until(baseline_running, 600)
        baseline_seconds = time.monotonic() - started
        batch.delete_collection_namespaced_job("baseline", propagation_policy="Background")

        # Ours: the operator as a separate process, as it runs in a cluster.
        metrics_port, health_port = free_port(), free_port()
        operator = subprocess.Popen(
            [str(Path(sys.executable).parent / "kuberl"), "operator", "--kubeconfig", str(plane.kubeconfig),
             "--metrics-port", str(metrics_port), "--health-port", str(health_port)],
            stdout=open(work / "operator.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_until(lambda: _ok(f"http://127.0.0.1:{health_port}/healthz"), 60)
        custom = client.CustomObjectsApi(plane.api_client())
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: custom.create_namespaced_custom_object("kuberl.dev", "v1alpha1", "ours", "rljobs", rljob(n)), names))

        def ours_running() -> bool:
            items = custom.list_namespaced_custom_object("kuberl.dev", "v1alpha1", "ours", "rljobs")["items"]
            return sum((i.get("status") or {}).get("phase") == "Running" for i in items) == len(names)

        wait_until(ours_running, 900)
        ours_seconds = time.monotonic() - started
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            buckets = reconcile_buckets(r.read().decode())
    finally:
        if operator is not None:
            os.killpg(operator.pid, signal.SIGTERM)
            operator.wait(15)
        plane.stop()

    result = {
        "benchmark": "operator",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "jobs": args.jobs,
        "pods": 2 * args.jobs,
        "baseline_plain_jobs_all_running_seconds": round(baseline_seconds, 2),
        "rljobs_all_running_seconds": round(ours_seconds, 2),
        "ratio_rljobs_over_plain_jobs": round(ours_seconds / baseline_seconds, 2),
        "reconciles": int(buckets[-1][1]),
        "reconcile_p50_seconds": round(histogram_quantile(0.5, buckets), 4),
        "reconcile_p99_seconds": round(histogram_quantile(0.99, buckets), 4),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "operator.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


if __name__ == "__main__":
    main()
