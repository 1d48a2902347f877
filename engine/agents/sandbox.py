"""Running a user's tool code in a process of its own, with limits, and reading back bounded output.

Each call starts `python -I -B sandbox_child.py` in a new session (its own process group), in a
fresh scratch directory, with an environment of its own (none of the trainer's variables, so no
credentials). The child limits itself before any user code runs (sandbox_child.py: address space,
CPU seconds, file sizes, no network, not root, an audit hook). The parent keeps the wall-clock
limit: past it the whole process group is killed. stdout and stderr go to a file the child cannot
name; the parent reads at most `max_output_bytes` + 1 of it, so nothing a tool prints reaches the
trainer's memory or logs unbounded.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHILD = Path(__file__).with_name("sandbox_child.py")
log = logging.getLogger("kuberl.engine")
_reported: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Limits:
    timeout: float
    """Wall-clock seconds."""
    memory_mb: int = 512
    max_output_bytes: int = 16384


@dataclass(frozen=True)
class Outcome:
    reply: dict[str, Any] = field(default_factory=dict)
    """The child's JSON reply (empty when it died before writing one)."""
    output: bytes = b""
    """The first max_output_bytes + 1 bytes of what it printed."""
    printed: int = 0
    """How many bytes it printed in all."""
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def printed_too_much(self) -> bool:
        return self.returncode == -signal.SIGXFSZ or self.returncode == 128 + signal.SIGXFSZ

    def death(self) -> str | None:
        """Why the child ended without a reply, in words (None when it replied)."""
        if self.reply:
            return None
        if self.timed_out:
            return None
        if self.printed_too_much:
            return "the tool wrote more than its output limit and was stopped"
        if self.returncode is not None and self.returncode < 0:
            name = signal.Signals(-self.returncode).name if -self.returncode in signal.valid_signals() else str(-self.returncode)
            return f"the tool's process was killed by {name} (a CPU or memory limit, or a crash)"
        return f"the tool's process exited with code {self.returncode} without a result"


def _environment(scratch: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _read_prefix(f, limit: int) -> tuple[bytes, int]:
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    return f.read(limit), size


def run_in_sandbox(request: dict[str, Any], limits: Limits) -> Outcome:
    """Run one request (sandbox_child.py's modes) in a fresh sandboxed process."""
    private = tempfile.mkdtemp(prefix="kuberl-tool-io-")  # the parent's files: the child holds only descriptors
    scratch = tempfile.mkdtemp(prefix="kuberl-tool-")
    file_bytes = 8 * limits.max_output_bytes + 65536
    request = {**request, "scratch": scratch, "memory_mb": limits.memory_mb, "cpu_seconds": math.ceil(limits.timeout) + 1,
               "file_bytes": file_bytes, "max_output_bytes": limits.max_output_bytes}
    start = time.monotonic()
    try:
        with open(os.path.join(private, "out"), "w+b") as out, open(os.path.join(private, "reply"), "w+b") as reply_file:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", str(CHILD)], stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                cwd=scratch, env=_environment(scratch), start_new_session=True, close_fds=True,
                pass_fds=(reply_file.fileno(),))
            timed_out = False
            try:
                proc.communicate(json.dumps({**request, "reply_fd": reply_file.fileno()}).encode(), timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc.pid)
            proc.wait()
            output, printed = _read_prefix(out, limits.max_output_bytes + 1)
            raw, _ = _read_prefix(reply_file, file_bytes)
        try:
            reply = json.loads(raw.decode("utf-8", "replace")) if raw else {}
        except json.JSONDecodeError:
            reply = {}
        _report(reply)
        return Outcome(reply if isinstance(reply, dict) else {}, output, printed, proc.returncode, timed_out,
                       time.monotonic() - start)
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    """The tool's whole process group (it is its own session's leader): whatever it left running ends too."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _report(reply: Any) -> None:
    """Log, once per process, how a tool's process was isolated (it depends on what the kernel and
    the container allow: a network namespace, or the audit hook alone)."""
    if not isinstance(reply, dict) or "isolation" not in reply:
        return
    key = (str(reply["isolation"]), str(reply.get("user")))
    if key not in _reported:
        _reported.add(key)
        log.info("tool sandbox: network %s; user %s; limits on memory, CPU time, file size and open files; an audit hook "
                 "refuses sockets, processes and writes outside the scratch folder", *key)
