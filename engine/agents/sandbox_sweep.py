"""What a sandbox pod's server does between two calls: nothing of the last call may survive it.

The server is the pod's process tree. In its container it is PID 1 of the container's PID namespace:
every other process there is a call's, and all are killed at once with kill(-1), which a fork bomb
cannot outrun. Elsewhere (a test on this machine) it is
a child subreaper, so that a daemon a call left behind (double fork, setsid) is re-parented to it,
stays its descendant, and is killed as one. Then the scratch folders are emptied, whatever modes the
call left on them. The server also makes itself undumpable: a call running as its user (the plain
process backend) can then neither trace it nor read its memory or environment through /proc.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import time
from pathlib import Path

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def guard_server() -> None:
    """Undumpable, and the reaper of every orphan of its tree."""
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process this one can see."""
    table: dict[int, tuple[int, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # the name, in parentheses, may hold spaces
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def targets(table: dict[int, tuple[int, str]], me: int, whole_namespace: bool) -> set[int]:
    """The processes to kill: every other one of the namespace, or (not its init) `me`'s descendants."""
    if whole_namespace:
        return {pid for pid in table if pid != me}
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(me, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(whole_namespace: bool, within: float = 10.0) -> list[int]:
    """Kill (SIGKILL) every process of the call's tree and reap them, until none is left; the pids
    still there after `within` seconds (none, unless the kernel could not end one)."""
    me = os.getpid()
    deadline = time.monotonic() + within
    while True:
        if whole_namespace:
            # One signal to every other process of the namespace, sent while the kernel holds its task
            # list: no fork completes during it, so a fork bomb cannot outrun it as it outruns a sweep
            # that reads /proc first and kills what it read.
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass  # nothing else runs
        table = process_table()
        left = targets(table, me, whole_namespace)
        for pid in left:
            if table[pid][1] not in ("Z", "X"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        _reap()  # ours, and the orphans re-parented to us (init, or the subreaper)
        if not left:
            return []
        if time.monotonic() > deadline:
            return sorted(left)
        time.sleep(0.01)


def wipe(folder: Path) -> None:
    """Remove everything inside `folder` (not the folder): a call may have taken the permissions off
    its own folders, so the owner's are given back first (the server runs as the call's user)."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for _ in range(3):
        entries = list(folder.iterdir())
        if not entries:
            return
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                _open_up(entry)
                shutil.rmtree(entry, ignore_errors=True)
            else:
                try:
                    entry.unlink()
                except FileNotFoundError:
                    pass


def _open_up(top: Path) -> None:
    """Give the owner rwx on `top` and every folder below it (iteratively: a call may nest deeply)."""
    todo = [str(top)]
    while todo:
        path = todo.pop()
        try:
            os.chmod(path, stat.S_IRWXU)  # folders only: the call is over, nothing swaps one for a link now
            with os.scandir(path) as it:
                todo += [e.path for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            pass
