"""What isolating a tool call costs: the latency of one `python` tool call under each sandbox, side by side.

Four ways of running the same call (a calculator-sized snippet), interleaved call by call so that the
machine's noise falls on all of them alike:
- process: a plain child process guarded by the audit hook only (what `allowUnisolatedTools` gives);
- bubblewrap: the call in namespaces of its own with a seccomp filter (under `kuberl run`);
- server/process and server/bubblewrap: the call sent over HTTP to a sandbox server (`kuberl sandbox-serve`,
  what a sandbox pod runs), which runs it with a plain process (a pod whose runtime refuses user namespaces:
  the pod is the boundary) or under bubblewrap, then kills what the call left and empties its scratch.
The servers run on loopback here: a pod network adds its round trip on a cluster.
The floor is the start of a bare interpreter (`python -I -B -c pass`), measured in the same rounds: no
sandbox that starts a process per call can be faster, so each sandbox is reported as a ratio to the
process baseline and as the floor's share of its latency.

Usage: .venv/bin/python bench/sandbox/run.py [--calls 40]     (about a minute on 2 CPU cores)
Writes bench/results/sandbox.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench" / "results" / "sandbox.json"
CODE = "print(17 * 23 + 4)"
EXPECTED = b"395"


def start_server(backend: str, scratch: Path) -> tuple[subprocess.Popen, str]:
    """A sandbox server on a free loopback port, and its URL, once it says it serves."""
    kuberl = str(Path(sys.executable).with_name("kuberl"))
    proc = subprocess.Popen(
        [kuberl, "sandbox-serve", "--port", "0", "--host", "127.0.0.1", "--scratch", str(scratch), "--backend", backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        found = re.search(r"serving on 127\.0\.0\.1:(\d+)", line)
        if found:
            return proc, f"http://127.0.0.1:{found.group(1)}"
        if not line:
            break
    proc.kill()
    raise SystemExit(f"the {backend} sandbox server did not start")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per sandbox (default 40)")
    args = parser.parse_args()

    from kuberl.engine.agents.sandbox import SANDBOX_BACKENDS, Limits
    from kuberl.engine.agents.sandbox_pod import PodBackend

    limits = Limits(timeout=30.0)
    request = {"mode": "python", "code": CODE}
    root = Path(tempfile.mkdtemp(prefix="kuberl-bench-sandbox-"))
    servers = {name: start_server(name, root / name) for name in ("process", "bubblewrap")}
    try:
        backends = {
            "process": SANDBOX_BACKENDS["process"](),
            "bubblewrap": SANDBOX_BACKENDS["bubblewrap"](),
            **{f"server/{name}": PodBackend(url) for name, (_, url) in servers.items()},
        }

        def call(backend) -> Callable[[], None]:
            def run() -> None:
                outcome = backend.run(request, limits)
                assert outcome.output.strip() == EXPECTED, (outcome.output[:200], outcome.death())

            return run

        def floor() -> None:
            subprocess.run([sys.executable, "-I", "-B", "-c", "pass"], check=True)

        runs: dict[str, Callable[[], None]] = {"floor": floor, **{name: call(b) for name, b in backends.items()}}
        for run in runs.values():  # warm the page cache and the servers' first call
            run()
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.calls):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - started)
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)

    median = {name: statistics.median(v) for name, v in seconds.items()}
    rows = [
        {
            "sandbox": name,
            "median_ms": round(1000 * median[name], 1),
            "p90_ms": round(1000 * percentile(v, 0.9), 1),
            "ratio_to_process": round(median[name] / median["process"], 2),
            "floor_share": round(median["floor"] / median[name], 2),
        }
        for name, v in seconds.items()
        if name != "floor"
    ]
    result = {
        "benchmark": "sandbox",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
        "call": CODE,
        "calls_per_sandbox": args.calls,
        "floor_median_ms": round(1000 * median["floor"], 1),
        "rows": rows,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
