"""The gang supervision shared by `kuberl run` and multi-GPU pods: the first failure ends every process."""

from __future__ import annotations

import subprocess
import sys
import time

from kuberl.engine.runtime.processes import first_failure, stop, wait_for_gang


def test_the_cause_is_a_killed_process_first_then_the_lowest_index() -> None:
    assert first_failure([None, 0, None]) is None
    assert first_failure([0, 0]) is None
    assert first_failure([None, 1, 1]) == 1
    assert first_failure([1, None, -9]) == 2  # killed by a signal: it did not fail because of a peer
    assert first_failure([-15, -9]) == 0
    assert first_failure([-6, 1, -9]) == 2  # a peer's loss can end in SIGABRT: the killed one caused it
    assert first_failure([1, -11]) == 1  # a crash of its own comes before an exit code


def test_a_failing_process_ends_the_gang() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    procs = [subprocess.Popen(sleeper), subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"]), subprocess.Popen(sleeper)]
    started = time.monotonic()
    try:
        cause, codes = wait_for_gang(procs, poll_s=0.05)
        assert (cause, codes[1]) == (1, 3)
    finally:
        stop(procs, grace_s=5)
    assert all(p.returncode is not None for p in procs)
    assert procs[0].returncode == procs[2].returncode == -15  # stopped with SIGTERM, not left running
    assert time.monotonic() - started < 60


def test_a_gang_that_finishes_reports_no_cause() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert wait_for_gang(procs, poll_s=0.05) == (None, [0, 0])
