"""bench/ci: how long CI takes, cold and warm, on this machine: `.ci/run` on a fresh clone.

    .venv/bin/python bench/ci/run.py --warm            # the machine's caches as they are
    .venv/bin/python bench/ci/run.py --cold --warm     # caches emptied first, then both runs

CI runs `.ci/run` on a fresh clone of main; its budget is 75 minutes on empty caches (90 at most) and 40
on warm ones. `--cold` DELETES this machine's caches first (~/.cache/kuberl: the Kubernetes, node and
scheduling binaries and the images; ~/.cache/uv; Go's build and module caches): a second copy of them
(about 50 GB) would not fit beside the first. The cold run then fills them again, and a warm run after
it uses them. Results go to bench/results/ci.json: the wall seconds of each run, the seconds
`make setup` took, and the test counts of `.ci/run`'s closing line; bench/results/ci-*.log.head keeps
each run's digest (the first lines of its log).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from kuberl.operator.testing.mounts import unmount_under

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "ci.json"
BUDGET = {"cold": 75 * 60, "warm": 40 * 60}
HOME = Path.home()


def caches() -> list[Path]:
    go = {k: subprocess.run(["go", "env", k], capture_output=True, text=True, timeout=60).stdout.strip() for k in ("GOCACHE", "GOMODCACHE")}
    return [HOME / ".cache" / "kuberl", HOME / ".cache" / "uv", *(Path(v) for v in go.values() if v)]


def empty_caches() -> None:
    for folder in caches():
        if folder.exists():
            unmount_under(folder)  # buildah's storage keeps mounts inside the cache: rmtree would fail with EBUSY
            # Go's module cache is read-only by design.
            subprocess.run(["chmod", "-R", "u+w", str(folder)], timeout=600)
            shutil.rmtree(folder)


def run_ci(kind: str, scratch: Path) -> dict:
    clone = scratch / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["CI"] = "true"
    if kind == "cold":
        empty_caches()
    log = scratch / f"ci-{kind}.log"
    started = time.monotonic()
    with open(log, "w") as out:
        result = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=95 * 60)
    seconds = time.monotonic() - started
    text = log.read_text()
    setup = re.search(r"\[ci\] setup took (\d+) s", text)
    counts = text.strip().splitlines()[-1] if text.strip() else ""
    kept = REPO / "bench" / "results" / f"ci-{kind}.log.head"
    kept.write_text("\n".join(text.splitlines()[:60]))  # the digest: counts, failures, skips
    whole = Path(tempfile.gettempdir()) / f"kuberl-ci-{kind}.log"  # the whole log outlives the clone
    shutil.copyfile(log, whole)
    print(f"{kind}: the whole log is {whole}")
    return {
        "exit_status": result.returncode,
        "wall_seconds": round(seconds),
        "setup_seconds": int(setup.group(1)) if setup else None,
        "budget_seconds": BUDGET[kind],
        "within_budget": seconds <= BUDGET[kind],
        "closing_line": counts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()
    kinds = [k for k in ("cold", "warm") if getattr(args, k)] or ["warm"]
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results = {"benchmark": "ci", "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    runs = dict(previous.get("runs", {}))
    for kind in kinds:
        scratch = Path(tempfile.mkdtemp(prefix=f"kuberl-ci-{kind}-"))
        try:
            runs[kind] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **run_ci(kind, scratch)}
            print(f"{kind}: {runs[kind]}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    results["runs"] = runs
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["exit_status"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
