"""One real node per machine: a session holds this lock while its node runs.

A second session would take the first one's node for a stale one (remove_stale_nodes kills its
namespace's processes and pods and unmounts its folders), so it waits for the first to end instead.
The lock is a file lock: it ends with the process that holds it, also when that process is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

NODE_LOCK = Path("/run/kuberl-real-node.lock")


class NodeBusy(RuntimeError):
    """Another session held the machine's real node for longer than this one would wait."""


@contextlib.contextmanager
def one_node_per_machine(wait_s: float, path: Path = NODE_LOCK, poll_s: float = 5.0) -> Iterator[None]:
    """Hold the machine's real-node lock for the block, waiting up to `wait_s` for another holder."""
    with open(path, "a+") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    holder = lock.read().strip() or "a process that did not say which"
                    raise NodeBusy(
                        f"another real-node session ({holder}) held {path} for {wait_s:.0f} s; only one runs per machine"
                    ) from None
                time.sleep(poll_s)
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}\n")
        lock.flush()
        yield
