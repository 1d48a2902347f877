"""The real node's lock: a second session waits for the first, names it when it gives up, and gets
the lock once the first ends, also when it was killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kuberl.operator.testing.node_lock import NodeBusy, one_node_per_machine

HOLDER = """
import sys, time
from pathlib import Path
from kuberl.operator.testing.node_lock import one_node_per_machine
with one_node_per_machine(0, path=Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_session_waits_names_the_holder_and_gets_the_lock_when_it_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        with pytest.raises(NodeBusy, match=f"another real-node session \\(pid {holder.pid}\\) held .* for 1 s"):
            with one_node_per_machine(1.0, path=path, poll_s=0.1):
                pass
        assert time.monotonic() - started >= 1.0  # it waited
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with one_node_per_machine(5.0, path=path, poll_s=0.1):
        assert path.read_text() == f"pid {os.getpid()}\n"
