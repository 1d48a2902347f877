"""Shared fixtures. Tests import the installed kuberl package, never the source folders directly."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def kuberl_cli() -> str:
    """The installed `kuberl` console script (the one a user runs)."""
    path = shutil.which("kuberl", path=os.pathsep.join([str(Path(os.sys.executable).parent), os.environ.get("PATH", "")]))
    if path is None:
        pytest.fail("the kuberl console script is not installed: run scripts/setup.sh")
    return path


# --- the real control plane (cluster tier) ----------------------------------------------------


def kube_binaries() -> Path:
    """The bin directory of scripts/kube-binaries.sh: built on first use, then taken from the cache."""
    import subprocess

    script = REPO / "scripts" / "kube-binaries.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        pytest.fail(
            f"the Kubernetes binaries are missing and could not be built ({script}):\n{result.stderr[-3000:]}",
            pytrace=False,
        )
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def kube_binaries_dir() -> Path:
    """The folder with kubectl, helm and the control plane's binaries (built once per machine)."""
    return kube_binaries()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory):
    """etcd, kube-apiserver, controller-manager, scheduler and kwok nodes on loopback, for the session.

    Node pools: gpu-h100 and gpu-a100 (2 nodes x 8 nvidia.com/gpu each, tainted
    nvidia.com/gpu=present:NoSchedule) and cpu (2 nodes). See kuberl.operator.testing.control_plane.
    """
    import time

    from kuberl.operator.testing.control_plane import ControlPlaneError, start_control_plane

    bin_dir = kube_binaries()
    workdir = tmp_path_factory.mktemp("control-plane")
    started = time.monotonic()
    try:
        plane = start_control_plane(bin_dir, workdir)
    except ControlPlaneError as exc:
        pytest.fail(f"the test control plane did not start: {exc}", pytrace=False)
    plane.start_seconds = time.monotonic() - started
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def schedulers(control_plane, tmp_path_factory: pytest.TempPathFactory):
    """JobSet (which runs every RLJob's pods) and Kueue (which admits queued ones), real, as processes against
    the session's control plane, their webhooks registered by URL (kuberl.operator.testing.scheduling)."""
    from kuberl.operator.testing.control_plane import ControlPlaneError
    from kuberl.operator.testing.scheduling import scheduling_root, start_schedulers

    try:
        root = scheduling_root(REPO / "scripts" / "scheduling-binaries.sh")
        started = start_schedulers(control_plane, tmp_path_factory.mktemp("schedulers"), root)
    except ControlPlaneError as exc:
        pytest.fail(f"JobSet and Kueue did not start: {exc}", pytrace=False)
    yield started
    started.stop()


@pytest.fixture(scope="session")
def rljob_crd(control_plane, schedulers) -> None:
    """The generated RLJob CRD, applied to the control plane and Established (with JobSet and Kueue running:
    the operator runs every job as a JobSet)."""
    from kuberl.operator.api.crd import CRD_FILE_NAME

    from kuberl.operator.testing.waiting import eventually

    control_plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / CRD_FILE_NAME))
    # Right after the apply the CRD may have no status.conditions yet, and `kubectl wait` then
    # fails at once ("<nil> is of the type <nil>") instead of waiting: ask until it answers.
    eventually(
        lambda: (
            control_plane.kubectl("wait", "--for=condition=Established", "crd/rljobs.kuberl.dev", "--timeout=60s", check=False).returncode
            == 0
        ),
        timeout=90,
        what="the RLJob CRD Established",
    )
