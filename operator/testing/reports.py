"""What a failed test on a real node prints about the cluster: every pod, why it is not running, and
the namespace's recent events. Read-only; a kubectl call that fails becomes its error text in the
report (it runs while a failure is being reported)."""

from __future__ import annotations

import json

from kuberl.operator.testing.control_plane import ControlPlane


def _waiting_reasons(pod: dict) -> str:
    reasons = []
    for status in pod.get("status", {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting:
            reasons.append(f"{status['name']}: {waiting.get('reason')} {waiting.get('message', '')[:300]}")
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("status") == "False" and condition.get("message"):
            reasons.append(f"{condition['type']}: {condition['message'][:300]}")
    return "; ".join(reasons)


def _namespace_state(plane: ControlPlane, namespace: str) -> list[str]:
    """Why a namespace is not gone: its phase and the namespace controller's conditions (what content
    or which finalizers remain, or which API group it could not list), one line each."""
    got = plane.kubectl("get", "namespace", namespace, "-o", "json", "--ignore-not-found", check=False)
    if not got.stdout.strip():
        return [f"namespace {namespace}: {got.stderr.strip()[-300:] or 'not found'}"]
    try:
        status = json.loads(got.stdout).get("status") or {}
    except ValueError:
        return [got.stdout[-300:]]
    lines = [f"namespace {namespace}: {status.get('phase')}"]
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True":
            lines.append(f"  {condition.get('type')}: {condition.get('message', '')[:400]}")
    return lines


def cluster_report(plane: ControlPlane, namespace: str) -> str:
    """Pods of all namespaces (phase, node, waiting reasons), the last events of `namespace`, the nodes,
    and last (the lines a CI log's tail shows) the state of `namespace` itself."""
    lines = ["--- pods"]
    pods = plane.kubectl("get", "pods", "-A", "-o", "json", check=False)
    try:
        for pod in json.loads(pods.stdout)["items"]:
            meta = pod["metadata"]
            lines.append(
                f"{meta['namespace']}/{meta['name']} {pod['status'].get('phase')} "
                f"deleting={bool(meta.get('deletionTimestamp'))} {_waiting_reasons(pod)}"
            )
    except (ValueError, KeyError):
        lines.append(pods.stderr[-1000:])
    events = plane.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)
    lines += [f"--- events in {namespace}", (events.stdout or events.stderr)[-4000:]]
    nodes = plane.kubectl("describe", "nodes", check=False)
    lines += ["--- nodes", nodes.stdout[-3000:], "--- namespace", *_namespace_state(plane, namespace)]
    return "\n".join(lines)
