"""The real-node tier: a control plane whose API server listens on the host end of a veth, and one
real node (kubelet, containerd, runc, CNI bridge, kube-proxy, CoreDNS) in a network namespace of its
own, with the operator and trainer images built here imported into its containerd.
See kuberl.operator.testing.node."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.slow


def _script(name: str) -> str:
    # Bounded: a cold build of the images and binaries takes about 20 minutes on 2 cores.
    result = subprocess.run(["bash", str(REPO / "scripts" / name)], capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        pytest.fail(f"scripts/{name} failed:\n{result.stderr[-4000:]}", pytrace=False)
    return result.stdout


@pytest.fixture(scope="session")
def built_images() -> dict[str, str]:
    """scripts/images.sh's output: PAUSE_/OPERATOR_/TRAINER_ IMAGE and ARCHIVE (built once per tree)."""
    lines = [line for line in _script("images.sh").splitlines() if "=" in line]
    return dict(line.split("=", 1) for line in lines)


NODE_LOCK_WAIT_S = 3600


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory, built_images: dict[str, str]):
    from kuberl.operator.testing.control_plane import ControlPlaneError, start_control_plane
    from kuberl.operator.testing.node import node_users, remove_stale_nodes, start_node
    from kuberl.operator.testing.node_lock import NodeBusy, one_node_per_machine
    from kuberl.operator.testing.node_network import HOST_IP, NodeNetwork, NodeNetworkError

    if os.geteuid() != 0:
        pytest.fail("the real-node tests need root (network namespaces, cgroups, mounts), as CI has", pytrace=False)
    kube_bin = Path(_script("kube-binaries.sh").strip().splitlines()[-1])
    node_bin = Path(_script("node-binaries.sh").strip().splitlines()[-1])
    workdir = tmp_path_factory.mktemp("real-node")
    held = contextlib.ExitStack()
    try:
        held.enter_context(one_node_per_machine(NODE_LOCK_WAIT_S))
    except NodeBusy as exc:
        pytest.fail(str(exc), pytrace=False)
    started = time.monotonic()
    remove_stale_nodes(workdir.parent.parent)  # all of this user's pytest runs
    plane = node = network = None
    try:
        network = NodeNetwork.create(str(os.getpid() % 10000))
        plane = start_control_plane(kube_bin, workdir / "plane", pools=(), address=HOST_IP, users=node_users())
        images = {built_images[f"{k}_IMAGE"]: Path(built_images[f"{k}_ARCHIVE"]) for k in ("PAUSE", "OPERATOR", "TRAINER")}
        # Kept between runs beside the node's binaries: an image already imported is not imported again.
        store = node_bin.parent / "containerd-root"
        node = start_node(
            plane, node_bin, kube_bin, workdir / "node", network, built_images["PAUSE_IMAGE"], images=images, image_store=store
        )
    except (ControlPlaneError, NodeNetworkError) as exc:
        if plane is not None:
            plane.stop()
        if network is not None:
            network.destroy()
        held.close()
        pytest.fail(f"the real node did not start: {exc}", pytrace=False)
    node.start_seconds = time.monotonic() - started
    with held:
        yield node
        node.stop()
        plane.stop()


CHART = REPO / "helm" / "kuberl"
HUB_TOKEN = "hf_kuberl_tests_token"  # what the hub stand-in accepts; the tests' hf-token Secrets hold it


@pytest.fixture(scope="session")
def hub_token() -> str:
    return HUB_TOKEN


@pytest.fixture(scope="session")
def hub(real_node):
    """A stand-in for the Hugging Face hub (the real one cannot be reached from here), speaking its HTTP
    protocol to the real huggingface_hub client, on the host's end of the node's veth: the pods reach it."""
    from kuberl.operator.testing.hub_server import HubServer
    from kuberl.operator.testing.node_network import HOST_IP

    server = HubServer(host=HOST_IP, token=HUB_TOKEN).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def node_schedulers(real_node, tmp_path_factory):
    """JobSet and Kueue, real, as processes on the host against the node's control plane (as a cluster admin
    installs them before kuberl): every RLJob's pods are a JobSet; a queued one is admitted by Kueue."""
    from kuberl.operator.testing.control_plane import ControlPlaneError
    from kuberl.operator.testing.scheduling import scheduling_root, start_schedulers, wait_for_garbage_collector

    try:
        root = scheduling_root(REPO / "scripts" / "scheduling-binaries.sh")
        started = start_schedulers(real_node.plane, tmp_path_factory.mktemp("node-schedulers"), root)
        # The garbage collector finds the JobSet type at its next discovery: until then a deleted
        # RLJob's JobSet (and its pods) would stay.
        wait_for_garbage_collector(real_node.plane)
    except ControlPlaneError as exc:
        pytest.fail(f"JobSet and Kueue did not start against the real node's plane: {exc}", pytrace=False)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def operator_release(real_node, built_images, hub, node_schedulers):
    """The chart, installed with the operator image built here; the operator runs in its own pod, and
    its initializers download from the hub stand-in (the chart's hubEndpoint). Per module: the
    quickstart's module installs the chart itself, as its user does."""
    from kuberl.operator.testing.control_plane import ControlPlaneError
    from kuberl.operator.testing.node import OPERATOR_NAMESPACE
    from kuberl.operator.testing.reports import cluster_report

    plane = real_node.plane
    repository, tag = built_images["OPERATOR_IMAGE"].rsplit(":", 1)
    try:
        plane.helm(
            "install",
            "kuberl",
            str(CHART),
            "--namespace",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--set",
            f"image.repository={repository}",
            "--set",
            f"image.tag={tag}",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            f"trainerImage={built_images['TRAINER_IMAGE']}",
            "--set",
            f"hubEndpoint={hub.url}",
            "--wait",
            "--timeout",
            "180s",
        )
    except ControlPlaneError as exc:
        pytest.fail(f"{exc}\n{cluster_report(plane, OPERATOR_NAMESPACE)}", pytrace=False)
    yield
    plane.helm("uninstall", "kuberl", "--namespace", OPERATOR_NAMESPACE, "--wait", check=False)


@pytest.fixture(scope="module")
def lora_volumes(real_node) -> Path:
    """Where the LoRA job's hostPath volume lives on the host (tests/node/test_lora_rljob.py)."""
    root = real_node.workdir / "lora-volumes"
    root.mkdir(exist_ok=True)
    return root


# --- NetworkPolicy enforcement on the real node ------------------------------------------------------


def _skip_unenforceable(missing: str) -> None:
    pytest.skip(
        f"no NetworkPolicy can be enforced on this machine: {missing}. The policy is checked against the "
        "pods' labels instead (tests/test_operator_confinement.py::"
        "test_the_policy_selects_every_pod_of_the_job_and_admits_its_trainer_pods_and_nothing_else)"
    )


@pytest.fixture(scope="module")
def network_policy_enforcer(real_node, tmp_path_factory):
    """The running enforcer and its log, for one module (the other modules' pods stay unjudged):
    kube-network-policies where the kernel takes its rules, else kube-router."""
    from kuberl.operator.testing import kube_router, network_policies

    workdir = tmp_path_factory.mktemp("netpol")
    try:
        no_queue = network_policies.kernel_refuses_queue()
        no_ipset = kube_router.kernel_refuses_ipset() if no_queue else None
        if no_queue and no_ipset:
            _skip_unenforceable(f"{no_queue}; {no_ipset}")
        if no_queue:
            proc = kube_router.start(real_node.plane, real_node.network.netns, real_node.name, workdir, kube_router.binary())
            log = workdir / "kube-router.log"
            ready = lambda: kube_router.wait_synced(proc, log)  # noqa: E731
            stop = lambda: kube_router.stop(proc, real_node.network.netns)  # noqa: E731
        else:
            proc = network_policies.start(real_node.plane, real_node.network.netns, real_node.name, workdir, network_policies.binary())
            log = workdir / "kube-network-policies.log"
            ready = lambda: _queue_works(proc, log)  # noqa: E731
            stop = lambda: _terminate(proc)  # noqa: E731
    except network_policies.EnforcerError as exc:  # the one error of both enforcers (enforcer_setup.py)
        pytest.fail(str(exc), pytrace=False)
    try:
        ready()
        yield proc, log
    finally:
        stop()


def _terminate(proc) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except Exception:  # noqa: BLE001 - it must not outlive the test
        proc.kill()


def _queue_works(proc, log) -> None:
    from kuberl.operator.testing import network_policies

    missing = network_policies.kernel_lacks(proc, log)
    if missing:
        _skip_unenforceable(missing)
