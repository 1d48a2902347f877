"""A label selector's verdict on a set of labels, as the API server evaluates it: how the tests check that a
Service, a Deployment or a NetworkPolicy selects exactly the pods it should."""

from __future__ import annotations

from typing import Any


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) against `labels`."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True
