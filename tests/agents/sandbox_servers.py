"""Sandbox servers (`kuberl sandbox-serve`) started as real processes on loopback, and a pod backend
that spreads calls over several of them as the headless Service's addresses would be."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kuberl.engine.agents.sandbox_pod import PodBackend

KUBERL = str(Path(sys.executable).with_name("kuberl"))


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    scratch: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(
    scratch: Path,
    backend: str = "auto",
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    preexec: Callable[[], object] | None = None,
) -> Server:
    """A server on a free loopback port, once it says it serves; `command` replaces the `kuberl` that
    starts it (a wrapper that ends with it), `preexec` runs in the child before it starts."""
    scratch.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [*(command or [KUBERL]), "sandbox-serve", "--port", "0", "--host", "127.0.0.1", "--scratch", str(scratch), "--backend", backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
        env=env if env is not None else dict(os.environ),
        text=True,
        preexec_fn=preexec,
    )
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the sandbox server ended with {proc.wait()} before serving")
        found = re.search(r"serving on 127\.0\.0\.1:(\d+)", line)
        if found:
            return Server(proc, int(found.group(1)), scratch)
    proc.kill()
    raise RuntimeError("the sandbox server did not start within 120 s")


class Servers(PodBackend):
    """The pod backend over several servers (each port one 'pod')."""

    def __init__(self, servers: list[Server], queue_seconds: float = 120.0):
        super().__init__(servers[0].url, queue_seconds=queue_seconds, ready_seconds=30.0)
        self.servers = servers

    def addresses(self) -> list[tuple[str, int]]:
        import random

        found = [("127.0.0.1", s.port) for s in self.servers]
        random.shuffle(found)
        return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(raw[raw.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found
