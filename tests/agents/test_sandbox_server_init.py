"""The sandbox server as the init of its own PID namespace, as it is in a sandbox pod's container: a
fork bomb that the audit hook does not stop (the hook is off, as if the code had got past it) ends
with its call, and the next call is served at once.

The namespace is a real Linux PID namespace (`unshare --pid`), and the bomb is bounded by a real pids
cgroup, as the kubelet's podPidsLimit bounds a pod: without that bound a fork bomb takes every PID of
the machine before any sweep runs (docs/security.md asks platform teams to set it). Needs root, for
the namespace and the cgroup."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from kuberl.engine.agents.sandbox import Limits
from kuberl.engine.agents.sandbox_bwrap import pids_cgroup, remove_cgroup
from kuberl.engine.agents.sandbox_pod import PodBackend

from .sandbox_servers import KUBERL, Server, descendants, start_server

PIDS_MAX = 1000
BOMB = (
    "import os, sys\nbomb = 'import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass'\n"
    "os.execv(sys.executable, [sys.executable, '-c', bomb])"
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace and a pids cgroup of its own need root and util-linux's unshare",
)


def _pids(cgroup: str) -> int:
    return int(Path(cgroup, "pids.current").read_text())


@pytest.fixture
def init_server(tmp_path: Path):
    cgroup = pids_cgroup(PIDS_MAX)
    if cgroup is None:
        pytest.skip("this machine has no pids cgroup controller that root can make a group in")
    procs = Path(cgroup, "cgroup.procs")
    server: Server | None = None
    try:
        # unshare forks the server as PID 1 of a new namespace, with its own /proc: what a container gets.
        # --kill-child: the server (and with it the namespace) ends when the fixture stops unshare.
        server = start_server(
            tmp_path / "scratch",
            backend="process",
            cwd=tmp_path,
            command=["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", KUBERL],
            preexec=lambda: procs.write_text(str(os.getpid())),
        )
        yield server, cgroup
    finally:
        if server is not None:
            server.stop()
        remove_cgroup(cgroup)


def test_a_fork_bomb_ends_with_its_call_and_the_next_call_is_served(init_server) -> None:
    server, cgroup = init_server
    pod = PodBackend(server.url, queue_seconds=30.0, ready_seconds=30.0)
    assert (
        pod.run({"mode": "python", "code": "import os; print(os.getpid() > 1)", "audit_hook": False}, Limits(timeout=10.0)).output
        == b"True\n"
    )
    idle = _pids(cgroup)  # unshare and the server, and the server's threads
    started = time.monotonic()
    bomb = pod.run({"mode": "python", "code": BOMB, "audit_hook": False}, Limits(timeout=3.0))
    assert bomb.timed_out, bomb  # it ran, and filled its pids cgroup, until the call's timeout
    after = pod.run({"mode": "python", "code": "print('served')", "audit_hook": False}, Limits(timeout=10.0))
    assert after.output == b"served\n", after
    # The call's 3 s, the sweep and the next call: seconds, not the client's 30 s margin.
    assert time.monotonic() - started < 20, time.monotonic() - started
    assert len(descendants(server.proc.pid)) == 1  # the server: nothing of the bomb is left
    assert _pids(cgroup) < idle + 8, (_pids(cgroup), idle)  # the server's threads come and go; the bomb had 1000


def test_the_server_started_this_way_is_its_namespaces_init(init_server) -> None:
    server, _ = init_server
    # As PID 1 the server kills every other process of its namespace after each call (not only its
    # own descendants): the unshare process outside the namespace is the server's parent.
    below = descendants(server.proc.pid)
    assert len(below) == 1, below  # the server; no call runs now
    status = Path(f"/proc/{below[0]}/status").read_text()
    nspid = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")][0]
    assert nspid[-1] == "1", nspid


def test_stopping_the_fixtures_unshare_ends_the_server(tmp_path: Path) -> None:
    cgroup = pids_cgroup(PIDS_MAX)
    if cgroup is None:
        pytest.skip("this machine has no pids cgroup controller that root can make a group in")
    try:
        server = start_server(
            tmp_path / "scratch",
            backend="process",
            cwd=tmp_path,
            command=["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", KUBERL],
        )
        [inner] = descendants(server.proc.pid)
        server.stop()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{inner}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{inner}").exists(), "the server outlived its unshare"
    finally:
        remove_cgroup(cgroup)
