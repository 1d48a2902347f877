"""Running a user's tool code outside the trainer, with limits, and reading back bounded output.

Each call starts `python -I -B sandbox_child.py` through a backend (a registry: bubblewrap, the
kernel boundary; process, a plain child process guarded by an audit hook only, for machines without
user namespaces, if the job allows it). The backend gives the command and how to start it; the
runner here is shared: the request goes in on stdin, stdout and stderr go to a file the child
cannot name, of which at most `max_output_bytes` + 1 bytes are read back, the reply comes back on a
descriptor, and past the wall-clock limit the whole process group is killed.

A backend that runs calls elsewhere (a sandbox pod) implements `SandboxBackend.run` itself.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..common.registry import Registry

CHILD = Path(__file__).with_name("sandbox_child.py")
log = logging.getLogger("kuberl.engine")


@dataclass(frozen=True)
class Limits:
    timeout: float
    """Wall-clock seconds."""
    memory_mb: int = 512
    max_output_bytes: int = 16384
    processes: int = 32
    """RLIMIT_NPROC of the call's user (inside its own user namespace where the backend gives one)."""
    scratch_mb: int = 64
    """The size of the call's private scratch folder (a tmpfs, under bubblewrap)."""

    @property
    def file_bytes(self) -> int:
        """RLIMIT_FSIZE: the largest file the tool may write (its printed output is one)."""
        return 8 * self.max_output_bytes + 65536


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
    error: str | None = None
    """Why the call did not run at all (a sandbox pod that could not be reached), in words."""

    @property
    def printed_too_much(self) -> bool:
        return self.returncode == -signal.SIGXFSZ or self.returncode == 128 + signal.SIGXFSZ

    def death(self) -> str | None:
        """Why the child ended without a reply, in words (None when it replied)."""
        if self.error is not None:
            return self.error
        if self.reply:
            return None
        if self.timed_out:
            return None
        if self.printed_too_much:
            return "the tool wrote more than its output limit and was stopped"
        if self.returncode is not None and self.returncode < 0:
            name = signal.Signals(-self.returncode).name if -self.returncode in signal.valid_signals() else str(-self.returncode)
            return f"the tool's process was killed by {name} (a CPU or memory limit, or a crash)"
        if self.returncode is not None and self.returncode > 128 and self.returncode - 128 in signal.valid_signals():
            # bubblewrap's init reports a child killed by a signal as 128 + the signal
            return f"the tool's process was killed by {signal.Signals(self.returncode - 128).name} (a CPU or memory limit, or a crash)"
        return f"the tool's process exited with code {self.returncode} without a result"


@dataclass(frozen=True)
class Launch:
    """How a backend starts one call's child: its command, descriptors it passes on, a hook run once it
    started (closing what only the command needed) and one run once it ended."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    scratch: str
    """The call's scratch folder as the child sees it."""
    pass_fds: tuple[int, ...] = ()
    cleanup: Callable[[], None] = lambda: None
    finish: Callable[[], None] = lambda: None
    status_fd: int | None = None
    """A descriptor on which the backend's launcher reports {"exit-code": N} when the main process
    ends (bwrap's --json-status-fd); the runner reads and closes it."""


class SandboxBackend(ABC):
    """One way of isolating a tool call. `run` is what the tools call; the default runs the command of
    `launch` on this machine with the shared runner."""

    name: str
    isolated: bool
    """Whether a kernel boundary (not only the audit hook) stands between the tool and the trainer."""

    @property
    @abstractmethod
    def description(self) -> str:
        """What the isolation is, in words, for the run's log."""

    @abstractmethod
    def launch(self, request: dict[str, Any], limits: Limits, scratch: str) -> Launch: ...

    def run(self, request: dict[str, Any], limits: Limits) -> Outcome:
        return run_child(self, request, limits)

    def probe(self) -> str | None:
        """None when this backend works here, else why not (a trivial call, run at start)."""
        try:
            outcome = self.run({"mode": "python", "code": "print('ok')"}, Limits(timeout=30.0))
        except OSError as exc:  # e.g. bwrap is not installed
            return str(exc)
        if outcome.reply.get("ok") and outcome.output.strip() == b"ok":
            return None
        said = outcome.output.decode("utf-8", "replace").strip()[:400]
        return said or outcome.death() or "the probe call timed out"


SANDBOX_BACKENDS: Registry[Callable[[], SandboxBackend]] = Registry("sandbox backend")


def register_sandbox_backend(name: str) -> Callable[[Callable[[], SandboxBackend]], Callable[[], SandboxBackend]]:
    def register(factory: Callable[[], SandboxBackend]) -> Callable[[], SandboxBackend]:
        SANDBOX_BACKENDS[name] = factory
        return factory

    return register


def _read_prefix(f, limit: int) -> tuple[bytes, int]:
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    return f.read(limit), size


def run_child(backend: SandboxBackend, request: dict[str, Any], limits: Limits) -> Outcome:
    """Run one request (sandbox_child.py's modes) in a fresh child of `backend`'s making."""
    private = tempfile.mkdtemp(prefix="kuberl-tool-io-")  # the parent's files: the child holds only descriptors
    scratch = tempfile.mkdtemp(prefix="kuberl-tool-")
    request = {
        **request,
        "memory_mb": limits.memory_mb,
        "cpu_seconds": math.ceil(limits.timeout) + 1,
        "file_bytes": limits.file_bytes,
        "max_output_bytes": limits.max_output_bytes,
        "processes": limits.processes,
    }
    start = time.monotonic()
    try:
        with (
            open(os.path.join(private, "out"), "w+b") as out,
            open(os.path.join(private, "reply"), "w+b") as reply_file,
            open(os.path.join(private, "request"), "w+b") as request_file,
        ):
            launch = backend.launch(request, limits, scratch)
            request = {**request, "scratch": launch.scratch, "isolation": backend.name, "reply_fd": reply_file.fileno()}
            request_file.write(json.dumps(request).encode())  # a file, not a pipe: nothing blocks on a child that does not read
            request_file.seek(0)
            try:
                try:
                    proc = subprocess.Popen(
                        launch.argv,
                        stdin=request_file,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=launch.cwd,
                        env=launch.env,
                        start_new_session=True,
                        close_fds=True,
                        pass_fds=(reply_file.fileno(), *launch.pass_fds),
                    )
                except BaseException:
                    if launch.status_fd is not None:
                        os.close(launch.status_fd)
                    raise
                finally:
                    launch.cleanup()
                ended, code = _wait(proc, launch.status_fd, start + limits.timeout)
                _kill_group(proc.pid)  # whatever the tool left running ends with it
                proc.wait()
            finally:
                launch.finish()
            output, printed = _read_prefix(out, limits.max_output_bytes + 1)
            raw, _ = _read_prefix(reply_file, limits.file_bytes)
        try:
            reply = json.loads(raw.decode("utf-8", "replace")) if raw else {}
        except json.JSONDecodeError:
            reply = {}
        return Outcome(
            reply if isinstance(reply, dict) else {},
            output,
            printed,
            proc.returncode if code is None else code,
            not ended,
            time.monotonic() - start,
        )
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _wait(proc: subprocess.Popen, status_fd: int | None, deadline: float) -> tuple[bool, int | None]:
    """Wait for the call's main process until `deadline`: (whether it ended, its exit code where the
    backend's status stream told it). With a status stream (bwrap's --json-status-fd) the call ends
    when its main process does, even if processes it started still run (they are killed then)."""
    if status_fd is None:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True, None
        except subprocess.TimeoutExpired:
            return False, None
    try:
        buffered = b""
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([status_fd], [], [], left)
            if not ready:
                break
            chunk = os.read(status_fd, 4096)
            if not chunk:  # bwrap ended without saying: it failed to set up, or was killed
                proc.wait()
                return True, None
            buffered += chunk
            for line in buffered.split(b"\n"):
                try:
                    status = json.loads(line)
                except ValueError:
                    continue
                if isinstance(status, dict) and "exit-code" in status:
                    return True, int(status["exit-code"])
        return False, None
    finally:
        os.close(status_fd)


def _kill_group(pgid: int) -> None:
    """The child's whole process group (it is its own session's leader): whatever it left running ends
    too. Under bubblewrap this kills bwrap, and with it the PID namespace and all inside it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
