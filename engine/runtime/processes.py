"""Supervising a gang of rank processes: `kuberl run` (every rank of a job) and a pod with several
GPUs (one rank per GPU). Torch cannot survive a lost rank, so the first failure ends them all."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable, Sequence


_SENT_FROM_OUTSIDE = frozenset({-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP})
"""Exit codes of a process ended by a signal that only another process sends (the OOM killer, a person)."""


def first_failure(codes: Sequence[int | None]) -> int | None:
    """The index of the process that caused a failure, or None while none has failed.

    Several may be seen failed in one poll; the others usually failed because of the first. A
    process ended by a signal sent from outside did not fail because of a peer, so it comes first;
    then one that crashed on a signal of its own (a peer's loss can end in gloo's std::terminate,
    SIGABRT, as the interpreter exits); then an exit code; the lowest index among equals.
    """

    def rank(code: int) -> int:
        return 0 if code in _SENT_FROM_OUTSIDE else 1 if code < 0 else 2

    failed = [(rank(code), index) for index, code in enumerate(codes) if code is not None and code != 0]
    return min(failed)[1] if failed else None


def wait_for_gang(
    procs: Sequence[subprocess.Popen], poll_s: float = 0.5, stopping: Callable[[], bool] = lambda: False
) -> tuple[int | None, list[int | None]]:
    """Wait until every process exits with 0 or one fails: (index of the cause or None, exit codes).

    Once `stopping()` is true (the gang was asked to stop), the processes exit on their own after
    their checkpoint, with non-zero codes: then wait for all of them instead of the first.
    """
    while True:
        codes = [p.poll() for p in procs]
        if stopping():
            if all(code is not None for code in codes):
                return first_failure(codes), codes
        else:
            cause = first_failure(codes)
            if cause is not None or all(code == 0 for code in codes):
                return cause, codes
        time.sleep(poll_s)


def forward_stop_signals(
    procs: Sequence[subprocess.Popen], forward_as: int | None = None, announce: Callable[[int, list[int]], None] | None = None
) -> list[int]:
    """Pass SIGTERM and SIGINT on to every process of `procs` still running (as `forward_as`, or as
    received), so each stops at its next step boundary with the others. Returns the list the
    received signals are appended to: non-empty means a stop was asked for. `announce(signum,
    received so far)` runs first, to tell a person. The handlers are installed explicitly, whatever
    dispositions this process inherited (a shell in the background ignores SIGINT)."""
    received: list[int] = []

    def on_signal(signum: int, frame) -> None:
        if announce is not None:
            announce(signum, received)
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(forward_as or signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    return received


def stop(procs: Sequence[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM every process still running, SIGKILL those that outlive the grace period."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
