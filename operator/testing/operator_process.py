"""`kuberl operator` as a subprocess with a given kubeconfig, for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from ..cli.ports import free_port
from .waiting import eventually


TEST_TRAINER_IMAGE = "registry.invalid/kuberl-trainer:test"


class OperatorProcess:
    """`kuberl operator` as a subprocess, authenticated by the kubeconfig it is given (a ServiceAccount token in the tests)."""

    def __init__(self, kubeconfig: Path, log: Path, args: tuple[str, ...] = ()):
        """`args`: more of `kuberl operator`'s options (--namespace, ...)."""
        self.kubeconfig, self.log, self.args = kubeconfig, log, args
        self.metrics_port, self.health_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        kuberl = Path(sys.executable).parent / "kuberl"
        self.proc = subprocess.Popen(
            [
                str(kuberl),
                "operator",
                "--kubeconfig",
                str(self.kubeconfig),
                "--metrics-port",
                str(self.metrics_port),
                "--health-port",
                str(self.health_port),
                # kwok runs no container: any name does, as the chart's trainerImage does on a real cluster.
                "--default-image",
                TEST_TRAINER_IMAGE,
                *self.args,
            ],
            stdout=open(self.log, "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        eventually(self.healthy, 30, "the operator's health endpoint")

    def healthy(self) -> bool:
        assert self.proc is not None, "start() first"
        if self.proc.poll() is not None:
            raise AssertionError(f"the operator exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def kill(self) -> None:
        assert self.proc is not None, "start() first"
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
