"""Leaving a real node as a test found it: a namespace gone, whatever its pods were doing."""

from __future__ import annotations

from kuberl.operator.testing.control_plane import ControlPlane
from kuberl.operator.testing.reports import cluster_report


def delete_namespace(plane: ControlPlane, namespace: str, grace_s: int = 120) -> None:
    """Delete `namespace` and wait until it is gone. Its pods get `grace_s` to stop (a trainer pod's own
    grace period can be minutes: it checkpoints on SIGTERM); then the ones left are removed without
    waiting for their containers, as a node drain's --force does. Raises AssertionError with the
    cluster's state if the namespace is still there after that."""
    def present() -> bool:
        return bool(plane.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name", check=False).stdout.strip())

    plane.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", f"--timeout={grace_s}s", check=False)
    if not present():
        return
    plane.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", "--wait=false", check=False)
    gone = plane.kubectl("wait", "--for=delete", f"namespace/{namespace}", "--timeout=120s", check=False)
    if gone.returncode != 0 and present():
        raise AssertionError(f"namespace {namespace} is still there after {grace_s + 120} s\n{cluster_report(plane, namespace)}")
