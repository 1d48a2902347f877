"""Whose object a name holds: the operator writes only objects that are absent or that this RLJob controls.

A namespace is shared: a Service, ConfigMap or Role with a child's name may already belong to someone
else (made by hand, by another tool, or by an RLJob deleted and made again under the same name whose
children the garbage collector has not yet taken). Writing over it would hand the job's pods another
tenant's object, or break it. So every object the operator would write is first looked up by name, and
`name_conflicts` decides, purely, which ones it must not touch. Pure: no API calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..api import API_VERSION, KIND

ObjectKey = tuple[str, str]
"""(kind, name) of an object in the RLJob's namespace."""


@dataclass(frozen=True)
class NameConflict:
    """A child's name taken by an object this RLJob does not control."""

    kind: str
    name: str
    owner: str
    """Who controls it, in words ("no controller", "RLJob x (uid ...)")."""

    def sentence(self) -> str:
        return f"{self.kind}/{self.name} exists and is not controlled by this RLJob ({self.owner})"


def key(obj: Mapping[str, Any]) -> ObjectKey:
    return obj["kind"], obj["metadata"]["name"]


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller reference (at most one per object, by the API's rules)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether this RLJob (by uid, not name: a job made again under the same name is another job) controls `obj`."""
    ref = controller_of(obj)
    return (
        ref is not None
        and ref.get("uid") == uid
        and ref.get("kind") == KIND
        and str(ref.get("apiVersion", "")).split("/")[0] == API_VERSION.split("/")[0]
    )


def _owner_words(obj: Mapping[str, Any]) -> str:
    ref = controller_of(obj)
    if ref is None:
        return "it has no controller"
    return f"its controller is {ref.get('kind', '?')} {ref.get('name', '?')} (uid {ref.get('uid', '?')})"


def name_conflicts(
    desired: Sequence[Mapping[str, Any]], found: Mapping[ObjectKey, Mapping[str, Any] | None], uid: str
) -> list[NameConflict]:
    """The desired objects whose name is held by an object that the RLJob `uid` does not control.
    `found`: what the API holds under each desired object's (kind, name); None or missing: absent."""
    conflicts = []
    for obj in desired:
        existing = found.get(key(obj))
        if existing is not None and not controlled_by(existing, uid):
            conflicts.append(NameConflict(kind=obj["kind"], name=obj["metadata"]["name"], owner=_owner_words(existing)))
    return conflicts
