"""The real kubernetes-sigs agent-sandbox controller on the test control plane (sandbox backend agentSandbox).

scripts/agent-sandbox-binaries.sh builds sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller from the Go
module proxy and unpacks, next to its bin/ folder, the module's CRDs (crds/*.yaml: Sandbox in
agents.x-k8s.io; SandboxClaim, SandboxTemplate, SandboxWarmPool in extensions.agents.x-k8s.io). Here, for a
started ControlPlane: the CRDs are applied and Established, and the controller runs as a local process with
the plane's admin kubeconfig, its extensions controllers on (--extensions), no leader election, metrics off,
its health probe on a loopback port; it dies with the test process. It registers no webhook.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..cli.ports import free_port
from .control_plane import ControlPlane, ControlPlaneError, _http_ok, _spawn_argv, _tail, _terminate, _wait

CONTROLLER = "agent-sandbox-controller"


def agent_sandbox_root(script: Path) -> Path:
    """The cache folder of `script` (the repository's scripts/agent-sandbox-binaries.sh): bin/ and crds/.
    Built on first use (minutes), then taken from the cache."""
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise ControlPlaneError(f"{script.name} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1]).parent


@dataclass
class AgentSandbox:
    """The controller running against a plane."""

    plane: ControlPlane
    workdir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def log(self, name: str = CONTROLLER, lines: int = 40) -> str:
        return _tail(self.workdir / f"{name}.log", lines)

    def stop(self) -> None:
        for proc in self.processes.values():
            _terminate(proc)
        self.processes.clear()

    def stop_checking_for_panics(self) -> None:
        """Stop the controller; AssertionError with its log's tail if it panicked while it ran."""
        log = self.log(lines=400)
        self.stop()
        assert "panic" not in log.lower(), log[-5000:]


def install_crds(plane: ControlPlane, root: Path) -> list[str]:
    """Apply the agent-sandbox CRDs and wait until they are Established; returns their names."""
    docs = [d for path in sorted((root / "crds").glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    if not docs:
        raise ControlPlaneError(f"no agent-sandbox CRDs in {root / 'crds'}")
    names = [d["metadata"]["name"] for d in docs]
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    deadline = time.monotonic() + 60
    while True:
        out = plane.kubectl("wait", "--for=condition=Established", "--timeout=30s", *[f"crd/{n}" for n in names], check=False)
        if out.returncode == 0:
            return names
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"agent-sandbox CRDs not Established: {out.stderr}")
        time.sleep(0.5)


def start_agent_sandbox(plane: ControlPlane, workdir: Path, root: Path, timeout: float = 60.0) -> AgentSandbox:
    """Install the CRDs and start the controller with its extensions; return once its readyz answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    install_crds(plane, root)
    health = free_port()
    started = AgentSandbox(plane, workdir)
    try:
        started.processes[CONTROLLER] = _spawn_argv(
            workdir / f"{CONTROLLER}.log",
            [
                str(root / "bin" / CONTROLLER),
                f"--kubeconfig={plane.kubeconfig}",
                "--extensions",
                "--leader-elect=false",
                "--metrics-bind-address=0",
                f"--health-probe-bind-address=127.0.0.1:{health}",
            ],
        )
        _wait(started, CONTROLLER, time.monotonic() + timeout, lambda: _http_ok(f"http://127.0.0.1:{health}/readyz"))
    except BaseException:
        started.stop()
        raise
    return started
