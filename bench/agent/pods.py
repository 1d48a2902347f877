"""The calculator demo with its tool calls in sandbox pods on the real node, beside today's in-process sandbox.

Issue 37's must-show ("safe on a shared cluster"). examples/agent-calculator-sandbox (SmolLM2-135M learns to
call a calculator that is a function tool, calculator.py, so its calls run in the tool sandbox; 10 steps),
run twice in turn on this machine, in one command, holding the machine's real-node lock throughout (no node
test runs beside it):

- in-process: `kuberl run` of the manifest; each call a bubblewrap process of the trainer's machine;
- pods: the same job as an RLJob on the real node (kuberl.operator.testing: a control plane, one node with
  containerd, kubelet, CoreDNS; JobSet and Kueue; the chart with the operator and trainer images that
  scripts/images.sh builds from this tree). The model (the same GGUF, converted as `kuberl run` converts it)
  and calculator.py are on a claim the trainer pod mounts; the job names no sandbox section, so its calls go
  to the operator's default sandbox pods (2 pods of 500m CPU and 1Gi), in a namespace that enforces Pod
  Security `restricted`. Checkpoints, metrics.jsonl and the trained model come back on a second claim.

For each: mean step time, tool-call latency (multi_turn/tool_seconds_mean and _p90, the trainer's view),
validation reward (steps 0 and 10) and the final model's held-out greedy accuracy with and without the
calculator (bench/agent/run.py's evaluate(), here, on each side's exported model). Writes
bench/results/agent_calculator_pods.json with the ratios pods / in-process, the machine, its load average
and how the node side was set up. About 45 minutes on 2 CPU cores, more when the trainer image must be rebuilt.

Usage: .venv/bin/python bench/agent/pods.py [--lock-wait 3600] [--keep]     (as root: the node needs it)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import evaluate_in_a_process  # noqa: E402  (bench/agent/run.py: one evaluation per process)

EXAMPLE = REPO / "examples" / "agent-calculator-sandbox"
JOB = EXAMPLE / "agent-calculator-sandbox.yaml"
RUN = REPO / "runs" / "agent-calculator-sandbox"
OUT = REPO / "bench" / "results" / "agent_calculator_pods.json"
CHART = REPO / "helm" / "kuberl"
TRAINER_UID = 10001
WORK_ROOT = Path(tempfile.gettempdir()) / "kuberl-bench-agent-pods"
JOB_TIMEOUT_S = 3600


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def script(name: str, **env: str) -> str:
    result = subprocess.run(["bash", str(REPO / "scripts" / name)], capture_output=True, text=True, timeout=3600, env={**os.environ, **env})
    if result.returncode != 0:
        raise SystemExit(f"scripts/{name} failed:\n{result.stderr[-4000:]}")
    return result.stdout


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def summary(records: list[dict], wall: float) -> dict[str, Any]:
    """What a side's metrics.jsonl says: step time, tool latency, rewards, validation."""
    steps = [r for r in records if "reward_mean" in r]
    timed = [r for r in steps if "multi_turn/tool_seconds_mean" in r]
    return {
        "steps": len(steps),
        "wall_seconds": round(wall, 1),
        "mean_step_seconds": mean([r["step_seconds"] for r in steps]),
        # Without the validation and checkpoint of the last step: the steps' rollout and training alone.
        "mean_step_seconds_less_validation_and_checkpoint": mean(
            [
                r["step_seconds"] - r.get("phase_seconds", {}).get("validation", 0.0) - r.get("phase_seconds", {}).get("checkpoint", 0.0)
                for r in steps
            ]
        ),
        "step_seconds": [round(r["step_seconds"], 2) for r in steps],
        "tool_seconds_mean": mean([r["multi_turn/tool_seconds_mean"] for r in timed]),
        "tool_seconds_p90": mean([r["multi_turn/tool_seconds_p90"] for r in timed]),
        "tool_seconds_per_step": [[round(r["multi_turn/tool_seconds_mean"], 4), round(r["multi_turn/tool_seconds_p90"], 4)] for r in timed],
        "rollout_seconds_mean": mean([r["phase_seconds"]["rollout"] for r in steps if "rollout" in r.get("phase_seconds", {})]),
        "tool_calls": sum(r["multi_turn/tool_calls"] for r in steps),
        "tool_errors": sum(r["multi_turn/tool_errors"] for r in steps),
        "tool_timeouts": sum(r["multi_turn/tool_timeouts"] for r in steps),
        "training_reward_mean": mean([r["reward_mean"] for r in steps]),
        "training_reward_last_step": round(steps[-1]["reward_mean"], 4) if steps else None,
        "validation_reward_with_tools": {
            str(r["step"]): round(r["validation_reward_mean"], 4) for r in records if r.get("validation_reward_mean") is not None
        },
    }


def said(log_text: str, words: str) -> str | None:
    """The first log line with `words`, from them on."""
    found = next((line for line in log_text.splitlines() if words in line), None)
    return found[found.index(words) :][:400] if found else None


def records_of(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


# --- in-process: kuberl run ------------------------------------------------------------------------------


def in_process(work: Path) -> dict[str, Any]:
    shutil.rmtree(RUN, ignore_errors=True)  # never an earlier run's checkpoints: kuberl run would resume from them
    load_before = load()
    started = time.monotonic()
    with open(work / "in-process.log", "w") as out:
        run = subprocess.run(
            [str(REPO / ".venv" / "bin" / "kuberl"), "run", str(JOB.relative_to(REPO)), "--metrics-port", "0"],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=JOB_TIMEOUT_S,
        )
    wall = time.monotonic() - started
    text = (work / "in-process.log").read_text()
    if run.returncode != 0:
        raise SystemExit(f"the in-process run failed:\n{text[-3000:]}")
    where = said(text, "tool calls run")
    return {
        **summary(records_of(RUN / "metrics.jsonl"), wall),
        "sandbox": where,
        "load_average_1_5_15": {"before": load_before, "after": load()},
    }


# --- pods: the same job as an RLJob on the real node -----------------------------------------------------


def host_claim(plane, namespace: str, claim: str, host: Path, read_only: bool = False) -> None:
    """A hostPath PersistentVolume bound ahead to `namespace/claim`, and the claim; its files owned by the trainer's user."""
    host.mkdir(parents=True, exist_ok=True)
    for path in [host, *host.rglob("*")]:
        os.chown(path, TRAINER_UID, TRAINER_UID)
    pv = f"bench-{namespace}-{claim}"
    docs = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "20Gi"},
                "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(host), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
    plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def cluster_job(namespace: str, image: str) -> dict[str, Any]:
    """The manifest's RLJob as a cluster runs it: the same spec, its files on claims (model and tool on rl-files at
    /data, read-only; checkpoints, metrics and the trained model on rl-out at /out), the trainer image built here."""
    from kuberl.operator.validation.manifest import read_documents

    [doc] = [d.content for d in read_documents(JOB.read_text(), str(JOB)) if d.content.get("kind") == "RLJob"]
    spec = doc["spec"]
    doc["metadata"]["namespace"] = namespace
    spec["image"], spec["imagePullPolicy"] = image, "Never"
    spec["volumes"] = [{"name": "files", "persistentVolumeClaim": {"claimName": "rl-files", "readOnly": True}}]
    spec["model"] = {"path": "/data/model", "dtype": spec["model"]["dtype"]}
    [tool] = spec["rollout"]["multiTurn"]["tools"]
    tool["path"] = "/data/calculator.py"
    spec["roles"]["actor"]["volumeMounts"] = [{"name": "files", "mountPath": "/data", "readOnly": True}]
    checkpoint = spec["trainer"]["checkpoint"]
    spec["trainer"]["checkpoint"] = {**checkpoint, "path": "/out", "claimName": "rl-out"}
    spec["trainer"]["exportPath"] = "/out/final"
    spec["monitoring"] = {"enabled": False}  # no Prometheus here; the step metrics are in /out/metrics.jsonl
    return doc


def status(plane, namespace: str, name: str) -> dict:
    got = plane.kubectl("get", "rlj", name, "-n", namespace, "-o", "json", check=False)
    return (json.loads(got.stdout).get("status") or {}) if got.returncode == 0 else {}


def pod_logs(plane, namespace: str, selector: str) -> str:
    pods = json.loads(plane.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)["items"]
    return "".join(
        f"--- {p['metadata']['name']}\n"
        + plane.kubectl("logs", p["metadata"]["name"], "-n", namespace, "--all-containers", check=False).stdout
        for p in pods
    )


def on_the_node(work: Path, kube_bin: Path, node_bin: Path, images: dict[str, str], evaluation: subprocess.Popen | None) -> dict:
    from kuberl.engine.models.resolve import model_folder
    from kuberl.operator.validation.manifest import load_rljobs
    from kuberl.operator.testing.control_plane import start_control_plane
    from kuberl.operator.testing import node as node_module
    from kuberl.operator.testing.node import OPERATOR_NAMESPACE, node_users, remove_stale_nodes, start_node
    from kuberl.operator.testing.node_network import HOST_IP, NodeNetwork
    from kuberl.operator.testing.scheduling import scheduling_root, start_schedulers, wait_for_garbage_collector

    started = time.monotonic()
    remove_stale_nodes(WORK_ROOT)  # what a killed earlier run of this bench left (the lock is ours: no live node)
    network = NodeNetwork.create(str(os.getpid() % 10000))
    plane = node = schedulers = None
    try:
        plane = start_control_plane(kube_bin, work / "plane", pools=(), address=HOST_IP, users=node_users())
        archives = {images[f"{k}_IMAGE"]: Path(images[f"{k}_ARCHIVE"]) for k in ("PAUSE", "OPERATOR", "TRAINER")}
        node = start_node(
            plane,
            node_bin,
            kube_bin,
            work / "node",
            network,
            images["PAUSE_IMAGE"],
            images=archives,
            image_store=node_bin.parent / "containerd-root",
        )
        schedulers = start_schedulers(plane, work / "schedulers", scheduling_root(REPO / "scripts" / "scheduling-binaries.sh"))
        wait_for_garbage_collector(plane)
        repository, tag = images["OPERATOR_IMAGE"].rsplit(":", 1)
        plane.helm(
            "install",
            "kuberl",
            str(CHART),
            "--namespace",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--set",
            f"image.repository={repository}",
            "--set",
            f"image.tag={tag}",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            f"trainerImage={images['TRAINER_IMAGE']}",
            "--wait",
            "--timeout",
            "300s",
        )
        setup_seconds = time.monotonic() - started
        log(f"the node, JobSet, Kueue and the chart are up in {setup_seconds:.0f} s")

        namespace = f"agent-pods-{uuid.uuid4().hex[:6]}"
        plane.kubectl("create", "namespace", namespace)
        plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
        files, out = work / "volumes" / "files", work / "volumes" / "out"
        [local] = load_rljobs(JOB)
        shutil.copytree(model_folder(local.spec.model, REPO), files / "model")  # the GGUF as kuberl run converts it
        shutil.copy(EXAMPLE / "calculator.py", files / "calculator.py")
        host_claim(plane, namespace, "rl-files", files, read_only=True)
        host_claim(plane, namespace, "rl-out", out)
        doc = cluster_job(namespace, images["TRAINER_IMAGE"])
        (work / "rljob.json").write_text(json.dumps(doc, indent=2))
        checked = subprocess.run(
            [str(REPO / ".venv" / "bin" / "kuberl"), "validate", str(work / "rljob.json")], capture_output=True, text=True, timeout=120
        )
        if checked.returncode != 0:
            raise SystemExit(f"the cluster RLJob does not validate:\n{checked.stderr}")
        if evaluation is not None:  # the in-process model's evaluation, run while the node started: done before the job
            log("waiting for the in-process model's evaluation")
            evaluation.wait()
        name = doc["metadata"]["name"]
        load_before = load()
        applied = time.monotonic()
        plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
        said_at, sandbox_pods = 0.0, []
        sandbox = f"kuberl.dev/sandbox={name}"
        while (now := status(plane, namespace, name)).get("phase") not in ("Succeeded", "Failed"):  # a kubectl every 10 s: little CPU
            if time.monotonic() - applied > JOB_TIMEOUT_S:
                raise SystemExit(f"{namespace}/{name} did not end within {JOB_TIMEOUT_S} s: {now}")
            if not sandbox_pods and (now.get("step") or 0) >= 1:
                # The sandbox pods as they served the first step (the operator deletes them when the job ends).
                sandbox_pods = json.loads(plane.kubectl("get", "pods", "-n", namespace, "-l", sandbox, "-o", "json").stdout)["items"]
                (work / "sandbox.log").write_text(pod_logs(plane, namespace, sandbox))
            if time.monotonic() - said_at > 60:
                said_at = time.monotonic()
                log(f"{namespace}/{name}: {now.get('phase')}, step {now.get('step')}")
            time.sleep(10)
        wall = time.monotonic() - applied
        s = status(plane, namespace, name)
        (work / "trainer.log").write_text(pod_logs(plane, namespace, f"kuberl.dev/job={name}"))
        if s.get("phase") != "Succeeded":
            raise SystemExit(f"the RLJob ended {s.get('phase')}: {json.dumps(s)[:2000]}\n{(work / 'trainer.log').read_text()[-3000:]}")
        if not (work / "sandbox.log").exists():
            (work / "sandbox.log").write_text("")
        trainer_log, sandbox_log = (work / "trainer.log").read_text(), (work / "sandbox.log").read_text()
        where = said(trainer_log, "tool calls run")
        serving = sorted({said(sandbox_log, k) for k in ("serving tool calls", "bubblewrap does not work")} - {None})
        container = sandbox_pods[0]["spec"]["containers"][0] if sandbox_pods else {}
        result = {
            **summary(records_of(out / "metrics.jsonl"), wall),
            "sandbox": where,
            "load_average_1_5_15": {"before": load_before, "after": load()},
            "restarts": s.get("restarts", 0),
        }
        result["setup"] = {
            "node": "kuberl.operator.testing: one real node (containerd, runc, kubelet, CNI bridge, kube-proxy, CoreDNS) in a "
            "network namespace of this machine, its control plane on the host; JobSet and Kueue as host processes; "
            f"the chart ({CHART.relative_to(REPO)}) with the operator in its pod",
            "images": {k: images[f"{k}_IMAGE"] for k in ("OPERATOR", "TRAINER")},
            "namespace": "Pod Security enforce=restricted",
            "sandbox_pods": len(sandbox_pods),
            "sandbox_pod_resources": container.get("resources"),
            "sandbox_server": serving,
            "network_policies": "made by the operator, not enforced (no NetworkPolicy enforcer runs in this bench)",
            "kubelet_pod_pids_limit": getattr(node_module, "POD_PIDS_LIMIT", None),
            "trainer_pod_resources": "none set (the job's; the pod uses the machine's cores as kuberl run does)",
            "files": "model (the GGUF converted as kuberl run converts it) and calculator.py on a hostPath claim at /data; "
            "checkpoints, metrics.jsonl and the trained model on a second claim at /out",
            "setup_seconds": round(setup_seconds, 1),
            "rljob": doc,
        }
        result["final"] = str(out / "final")
        return result
    finally:
        for what, stop in (
            (
                "the chart",
                lambda: (
                    plane.helm("uninstall", "kuberl", "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "120s", check=False)
                    if node is not None
                    else None
                ),
            ),
            ("JobSet and Kueue", schedulers.stop if schedulers is not None else lambda: None),
            ("the node", node.stop if node is not None else network.destroy),
            ("the control plane", plane.stop if plane is not None else lambda: None),
        ):
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - the rest must still stop
                log(f"stopping {what}: {exc}")


# --- both, in turn -----------------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def main() -> None:
    from kuberl.operator.testing.node_lock import one_node_per_machine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock-wait", type=float, default=3600, help="seconds to wait for another session's real node")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, the node's volumes)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the real node needs root (network namespaces, cgroups, mounts)")
    WORK_ROOT.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=WORK_ROOT))
    log(f"work folder {work}; waiting for the machine's real-node lock")
    with one_node_per_machine(args.lock_wait):
        load_at_start = load()
        log(f"lock held; load average {load_at_start}; building the node's binaries and images (cached when unchanged)")
        kube_bin = Path(script("kube-binaries.sh").strip().splitlines()[-1])
        node_bin = Path(script("node-binaries.sh").strip().splitlines()[-1])
        # The GPU trainer image is not needed here (no node runs it).
        images = dict(line.split("=", 1) for line in script("images.sh", KUBERL_GPU_IMAGE="0").splitlines() if "=" in line)
        log(f"images ready; in-process: kuberl run {JOB.relative_to(REPO)}")
        local = in_process(work)
        (work / "in-process.json").write_text(json.dumps(local, indent=2))  # each side as it ends, should a later one fail
        log(f"in-process: {local['mean_step_seconds']} s/step, tool calls {local['tool_seconds_mean']} s (p90 {local['tool_seconds_p90']})")
        # Its model's evaluation runs while the node starts (it uses no node; the job waits for it).
        with open(work / "eval-in-process.json", "w") as stdout, open(work / "eval-in-process.log", "w") as stderr:
            evaluation = subprocess.Popen(
                [sys.executable, str(REPO / "bench" / "agent" / "run.py"), "eval", str(RUN / "final"), str(JOB)],
                cwd=REPO,
                stdout=stdout,
                stderr=stderr,
            )
        try:
            pods = on_the_node(work, kube_bin, node_bin, images, evaluation)
        except BaseException:
            if evaluation.poll() is None:
                evaluation.kill()
            raise
        (work / "pods.json").write_text(json.dumps(pods, indent=2))
        log(f"pods: {pods['mean_step_seconds']} s/step, tool calls {pods['tool_seconds_mean']} s (p90 {pods['tool_seconds_p90']})")
    if evaluation.wait() != 0:
        raise SystemExit(f"evaluating the in-process model failed:\n{(work / 'eval-in-process.log').read_text()[-3000:]}")
    local["after"] = json.loads((work / "eval-in-process.json").read_text().strip().splitlines()[-1])
    log("evaluating the pods' model")
    pods["after"] = evaluate_in_a_process(Path(pods.pop("final")), JOB)
    result = {
        "job": str(JOB.relative_to(REPO)),
        "steps": local["steps"],
        "model": "SmolLM2-135M-Instruct",
        "task": "three-number sums, operands 0..50, 100 held-out prompts, greedy; the calculator a function tool (calc)",
        "definitions": {
            "mean_step_seconds": "the mean of the steps' step_seconds (metrics.jsonl)",
            "tool_seconds_mean": "the mean over steps of multi_turn/tool_seconds_mean: a call's wall seconds as the trainer's "
            "tools environment times it (32 trajectories' calls of a turn run at once)",
            "tool_seconds_p90": "the mean over steps of multi_turn/tool_seconds_p90 (each step's nearest-rank p90)",
            "after": "the exported model's greedy accuracy on the job's 100 validation sums, evaluated on this machine with "
            "the calculator run in-process (bench/agent/run.py's evaluate()) and without it",
        },
        "in_process": local,
        "pods": pods,
        "ratio_pods_over_in_process": {
            "mean_step_seconds": ratio(pods["mean_step_seconds"], local["mean_step_seconds"]),
            "mean_step_seconds_less_validation_and_checkpoint": ratio(
                pods["mean_step_seconds_less_validation_and_checkpoint"], local["mean_step_seconds_less_validation_and_checkpoint"]
            ),
            "tool_seconds_mean": ratio(pods["tool_seconds_mean"], local["tool_seconds_mean"]),
            "tool_seconds_p90": ratio(pods["tool_seconds_p90"], local["tool_seconds_p90"]),
        },
        "accuracy_with_tools_difference": round(pods["after"]["accuracy_with_tools"] - local["after"]["accuracy_with_tools"], 4),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "load_average_1_5_15": {"start": load_at_start, "end": load()},
        "command": ".venv/bin/python bench/agent/pods.py",
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    log(
        f"accuracy with the calculator: in-process {local['after']['accuracy_with_tools']:.0%}, pods "
        f"{pods['after']['accuracy_with_tools']:.0%}; step time x{result['ratio_pods_over_in_process']['mean_step_seconds']}, "
        f"tool latency x{result['ratio_pods_over_in_process']['tool_seconds_mean']}; wrote {args.out.relative_to(REPO)}"
    )


if __name__ == "__main__":
    main()
