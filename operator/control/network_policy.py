"""A job's NetworkPolicy: only the job's own trainer pods reach its pods, and Prometheus its metrics port.

The ranks meet at rank 0's TCPStore (MASTER_PORT) and talk over gloo links that unpickle what they
receive: a pod that can connect to them can run code in the trainer. So every pod of the job accepts
connections only from the job's trainer pods (its label, and a role that has pods of its own: not a
tool sandbox or any other pod that merely carries the job's label with another role), plus the
metrics port from the peers the chart names (its Prometheus). Egress is not restricted here: the pods
need DNS, the hub and the API server. Pure: no API calls. The policy holds only where the cluster's
network plugin enforces NetworkPolicy.
"""

from __future__ import annotations

from typing import Any, Sequence

from .children import LABEL_JOB, LABEL_ROLE, Owner

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"


def trainer_peer(job_name: str, roles: Sequence[str]) -> dict[str, Any]:
    """The job's trainer pods, as a NetworkPolicy peer (same namespace: no namespaceSelector)."""
    return {
        "podSelector": {
            "matchLabels": {LABEL_JOB: job_name},
            "matchExpressions": [{"key": LABEL_ROLE, "operator": "In", "values": sorted(roles)}],
        }
    }


def network_policy(
    owner: Owner, roles: Sequence[str], metrics_port: int | None, metrics_peers: tuple[dict[str, Any], ...]
) -> dict[str, Any]:
    """The policy of the job `owner` whose pods of their own have `roles`. `metrics_port`: the engine's
    Prometheus port (None: monitoring off); `metrics_peers`: NetworkPolicy peers that may scrape it."""
    ingress: list[dict[str, Any]] = [{"from": [trainer_peer(owner.name, roles)]}]
    if metrics_port is not None and metrics_peers:
        ingress.append({"from": [dict(p) for p in metrics_peers], "ports": [{"protocol": "TCP", "port": metrics_port}]})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": owner.meta(owner.name),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_JOB: owner.name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
