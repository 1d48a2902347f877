"""The RLJob's conditions: one per phase it has been in (True for the current one), plus Initialized."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ...api import Condition, Phase, RLJobStatus

CONDITION_TYPES: tuple[Phase, ...] = ("Initializing", "Queued", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
INITIALIZED = "Initialized"
"""A condition of its own, kept after the phase moves on: True once the cache holds every hub repository."""


def set_phase(status: RLJobStatus, phase: Phase, reason: str, message: str, now: datetime) -> None:
    """The phase, and its condition True (the others False); a transition time moves only on a change."""
    status.phase = phase
    by_type = {c.type: c for c in status.conditions}
    for kind in CONDITION_TYPES:
        active = kind == phase
        existing = by_type.get(kind)
        if existing is None and not active:
            continue
        wanted: Literal["True", "False"] = "True" if active else "False"
        if existing is not None and existing.status == wanted:
            if active:
                existing.reason, existing.message = reason, message
            continue
        by_type[kind] = Condition(
            type=kind,
            status=wanted,
            reason=reason if active else f"Not{kind}",
            message=message if active else "",
            last_transition_time=now,
        )
    others = [c for c in status.conditions if c.type not in CONDITION_TYPES]
    status.conditions = [by_type[k] for k in CONDITION_TYPES if k in by_type] + others


def set_condition(
    status: RLJobStatus, kind: str, value: Literal["True", "False", "Unknown"], reason: str, message: str, now: datetime
) -> None:
    """Set a condition that is not a phase; its transition time moves only when its status changes."""
    existing = next((c for c in status.conditions if c.type == kind), None)
    if existing is not None and existing.status == value:
        existing.reason, existing.message = reason, message
        return
    condition = Condition(type=kind, status=value, reason=reason, message=message, last_transition_time=now)
    status.conditions = [c for c in status.conditions if c.type != kind] + [condition]
