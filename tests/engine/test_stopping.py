"""A rank's answer to SIGTERM while it is blocked where Python's signal handlers cannot run: a
rendezvous that keeps retrying a peer (torch's TCPStore, connecting to a closed loopback port), as
the ranks of a job deleted while its pods were still starting were."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from kuberl.operator.cli.ports import free_port

RANK = """
import datetime, sys
import torch.distributed as dist
from kuberl.engine.runtime.stopping import StopRequest

stop = StopRequest().install()
if sys.argv[2] == "stepping":
    stop.steps_begin()
print("ready", flush=True)
dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=120))
"""


def _blocked_rank(stage: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, str(free_port()), stage], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=30)[1][-2000:]
    time.sleep(1.0)  # into the store's connect loop
    return proc


def _exit_within(proc: subprocess.Popen, seconds: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running {seconds} s after the signal: {err[-2000:]}") from None
    return proc.returncode, err


def test_sigterm_before_the_first_step_ends_a_rank_blocked_in_a_rendezvous_at_once() -> None:
    proc = _blocked_rank("starting")
    proc.send_signal(signal.SIGTERM)
    code, err = _exit_within(proc, 10)
    assert code == 128 + signal.SIGTERM
    assert "SIGTERM before the first step: nothing to save, exiting now" in err


def test_once_stepping_the_first_sigterm_waits_for_the_boundary_and_a_second_ends_the_rank() -> None:
    proc = _blocked_rank("stepping")
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(2.0)
        assert proc.poll() is None  # the step boundary decides, with a checkpoint
        proc.send_signal(signal.SIGTERM)
        code, err = _exit_within(proc, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signal.SIGTERM and "SIGTERM second signal, exiting now" in err
