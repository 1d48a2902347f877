"""`-o yaml|json|wide` of the job commands, as kubectl prints them.

yaml and json print the objects the API server returned, not the typed models: a field this version of kuberl does
not know still shows, and what a user sees is what `kubectl get rlj -o yaml` would show. Like kubectl, the keys are
sorted and metadata.managedFields is left out (kubectl's --show-managed-fields=false); a list is a `kind: List`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from kuberl.operator.api import RLJob

OUTPUTS = ("yaml", "json", "wide")


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """What `kubectl get -o yaml` prints for several objects (and `kuberl submit` reads back, item by item)."""
    return {"apiVersion": "v1", "kind": "List", "items": [without_managed_fields(i) for i in items], "metadata": {"resourceVersion": ""}}


def dump(obj: dict[str, Any], output: str) -> str:
    """The object as yaml or json, without a trailing newline."""
    obj = without_managed_fields(obj)
    if output == "json":
        return json.dumps(obj, indent=4, sort_keys=True, ensure_ascii=False)
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, allow_unicode=True, width=1 << 16).rstrip("\n")


def reason(job: RLJob) -> str:
    """The reason of the condition that explains the phase (its own, True), else of the newest True condition."""
    s = job.status
    if s is None:
        return "-"
    true = [c for c in s.conditions if c.status == "True"]
    current = [c for c in true if c.type == s.phase] or sorted(true, key=lambda c: c.last_transition_time)[-1:]
    return current[0].reason if current else "-"


def wide_columns(job: RLJob) -> list[str]:
    """The columns `list -o wide` adds after AGE: PREEMPTIONS, ALGORITHM, REASON."""
    s = job.status
    return [str(s.preemptions if s else 0), job.spec.algorithm.name, reason(job)]


WIDE_HEADER = ["PREEMPTIONS", "ALGORITHM", "REASON"]


def wide_lines(job: RLJob) -> list[tuple[str, str]]:
    """The lines `status -o wide` adds after Namespace."""
    s, m = job.status, job.spec.model

    def when(value: Any) -> str:
        return value.isoformat(timespec="seconds") if value is not None else "-"

    return [
        ("Algorithm", job.spec.algorithm.name),
        ("Model", str(m.path or m.gguf or m.hub_id or "-")),
        ("Created", job.metadata.creation_timestamp or "-"),
        ("Started", when(s.start_time if s else None)),
        ("Completed", when(s.completion_time if s else None)),
    ]
