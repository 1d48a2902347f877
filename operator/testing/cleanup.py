"""Leaving a real node as a test found it: a namespace gone, whatever its pods were doing."""

from __future__ import annotations

from kuberl.operator.api.run_policy import RunPolicy
from kuberl.operator.testing.control_plane import ControlPlane
from kuberl.operator.testing.reports import cluster_report

# After its first pass, the namespace controller looks again only after half the longest grace period
# left to the pods it asked to stop, plus a second (151 s for a trainer pod's default of 300 s), whatever
# happens to the pods meanwhile. A wait for the namespace has to outlast that.
NAMESPACE_RECHECK_S = RunPolicy().termination_grace_period_seconds // 2 + 1


def delete_namespace(plane: ControlPlane, namespace: str, grace_s: int = 60) -> None:
    """Delete `namespace` and wait until it is gone. Its pods are asked to stop within `grace_s` (a
    trainer pod's own grace period is minutes: it checkpoints on SIGTERM); the ones left after that are
    removed without waiting for their containers, as a node drain's --force does. Raises AssertionError
    with the cluster's state, the namespace's own conditions last, if the namespace is still there."""

    def present() -> bool:
        return bool(plane.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name", check=False).stdout.strip())

    def gone_within(seconds: int) -> bool:
        waited = plane.kubectl("wait", "--for=delete", f"namespace/{namespace}", f"--timeout={seconds}s", check=False)
        return waited.returncode == 0 or not present()

    if not present():
        return
    # Terminating, the namespace takes no new pods; the ones there get the shorter grace period.
    plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    plane.kubectl("delete", "pods", "--all", "-n", namespace, f"--grace-period={grace_s}", "--wait=false", check=False)
    if gone_within(grace_s + NAMESPACE_RECHECK_S):
        return
    plane.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", "--wait=false", check=False)
    if not gone_within(NAMESPACE_RECHECK_S):
        raise AssertionError(
            f"namespace {namespace} is still there after {grace_s + 2 * NAMESPACE_RECHECK_S} s\n{cluster_report(plane, namespace)}"
        )
