"""`kuberl run job.yaml`: an RLJob on this machine, one process per rank, no cluster.

Each rank gets the environment a pod of the job would get (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, KUBERL_CONFIG, KUBERL_ROLE, ...) and runs `kuberl worker`. Rank 0 prints to the
console; every rank logs to <run dir>/logs/rank-N.log. The first rank to fail ends the run: the
others are stopped and the reason is printed. Ctrl-C or SIGTERM stops every rank after its current step,
with a checkpoint, as a pod's SIGTERM does; running the same command again resumes from it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kuberl.engine.runtime.processes import forward_stop_signals, stop, wait_for_gang

from ..api.resource import RLJob
from ..validation.manifest import ManifestError, load_rljobs
from ..control.planner import engine_config
from .local_checks import local_model_problems
from .ports import free_port

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class LocalRank:
    rank: int
    role: str
    log: Path


def _die_with_parent() -> None:
    # A rank must not outlive `kuberl run` (killed with SIGKILL, it cannot stop its children itself).
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def load_one(path: Path) -> RLJob:
    jobs = load_rljobs(path)
    if len(jobs) != 1:
        raise ValueError(f"{path}: `kuberl run` takes exactly one RLJob, found {len(jobs)}")
    return jobs[0]


def rank_environment(
    rank: LocalRank, world: int, master_port: int, config_file: Path, job: str, run_dir: Path, threads: int
) -> dict[str, str]:
    """The variables a rank's worker reads, as a trainer pod of the job sets them (for this machine's loopback)."""
    return {
        "RANK": str(rank.rank),
        "LOCAL_RANK": str(rank.rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "KUBERL_CONFIG": str(config_file),
        "KUBERL_ROLE": rank.role,
        "KUBERL_JOB": job,
        "KUBERL_RUN_DIR": str(run_dir),
        "KUBERL_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
    }


def run_local(
    manifest: Path,
    run_dir: Path | None = None,
    metrics_port: int | None = None,
    threads: int | None = None,
    timeout_s: int | None = None,
    poll_s: float = 0.5,
) -> int:
    job = load_one(manifest)
    name = job.metadata.name
    if name is None:  # generateName alone: the API server names a job, nothing does here
        raise ValueError(f"{manifest}: `kuberl run` needs the job's metadata.name")
    # The model folder, checked before any rank starts (as `kuberl validate --local` does); the ranks read a
    # relative model.path from this process's folder, so it is checked from there.
    problems = local_model_problems(job, str(manifest), Path.cwd())
    if problems:
        raise ManifestError(problems)
    config = engine_config(job)
    master_port = free_port()
    updates: dict = {"master_port": master_port}
    if metrics_port is not None:
        updates["metrics_port"] = metrics_port or None
    config = config.model_copy(update=updates)
    run_dir = (run_dir or Path("runs") / name).resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "engine-config.json"
    config_file.write_text(config.model_dump_json(by_alias=True, indent=2))

    world = config.world_size
    per_rank_threads = threads or max(1, (os.cpu_count() or 1) // world)
    ranks = [LocalRank(r, role, run_dir / "logs" / f"rank-{r}.log") for r, role in enumerate(config.rank_roles())]
    print(
        f"kuberl run: {name}: {world} rank(s) on this machine, {per_rank_threads} thread(s) each; logs in {run_dir / 'logs'}",
        file=sys.stderr,
        flush=True,
    )
    procs: list[subprocess.Popen] = []
    # Ctrl-C and SIGTERM reach every rank as SIGTERM (a second one of either stops them at once);
    # installed before the first rank starts, so no signal is missed.
    signals = forward_stop_signals(procs, forward_as=signal.SIGTERM, announce=_announce)
    for r in ranks:
        env = {**os.environ, **rank_environment(r, world, master_port, config_file, name, run_dir, per_rank_threads)}
        if timeout_s:
            env["KUBERL_TIMEOUT_S"] = str(timeout_s)
        log = open(r.log, "w")
        # Rank 0 talks to the console (progress bar, summary); all ranks keep a full log.
        cmd = [sys.executable, "-m", "kuberl.engine.runtime.worker"]
        if r.rank == 0:
            tee = subprocess.Popen(
                ["tee", str(r.log)], stdin=subprocess.PIPE, stdout=sys.stderr, preexec_fn=_die_with_parent, start_new_session=True
            )
            proc = subprocess.Popen(
                cmd, env=env, stdout=tee.stdin, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, start_new_session=True
            )
            assert tee.stdin is not None  # stdin=PIPE
            tee.stdin.close()  # the rank holds the pipe now; tee ends when the rank does
            log.close()
        else:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, start_new_session=True)
        procs.append(proc)
    # Which process is which rank, for people (and tests) who want to look at one.
    (run_dir / "logs" / "ranks.json").write_text(json.dumps({str(r.rank): p.pid for r, p in zip(ranks, procs)}))
    return _wait(procs, ranks, poll_s, signals, grace_s=job.spec.run_policy.termination_grace_period_seconds)


def _announce(signum: int, received: list[int]) -> None:
    if not received:
        print(
            "\nkuberl run: interrupted; stopping every rank after its current step, with a checkpoint (again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
    elif signum == received[0]:
        print("\nkuberl run: stopping every rank now", file=sys.stderr, flush=True)


def _wait(procs: list[subprocess.Popen], ranks: list[LocalRank], poll_s: float, signals: list[int], grace_s: float) -> int:
    deadline: list[float] = []

    def stopping() -> bool:
        if signals and not deadline:
            deadline.append(time.monotonic() + grace_s)
        if deadline and time.monotonic() > deadline[0]:
            print(f"kuberl run: ranks still running {grace_s:.0f} s after the signal; killing them", file=sys.stderr)
            for p in procs:
                if p.poll() is None:
                    p.kill()
        return bool(signals)

    cause, codes = wait_for_gang(procs, poll_s, stopping=stopping)
    if signals:
        print(f"kuberl run: every rank stopped (exit codes {codes}); `kuberl run` again resumes from the last checkpoint", file=sys.stderr)
        return 128 + signals[0]
    if cause is None:
        print("kuberl run: every rank finished", file=sys.stderr)
        return 0
    stop(procs)
    rank = ranks[cause]
    print(f"kuberl run: rank {rank.rank} (role {rank.role}) exited with code {codes[cause]}; its log: {rank.log}", file=sys.stderr)
    for line in _tail(rank.log, 15):
        print(f"  | {line}", file=sys.stderr)
    return 1


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    keep = [line for line in text.splitlines() if line.strip()]
    return keep[-lines:]
