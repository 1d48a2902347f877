"""The NameConflict condition: a child's name is taken by an object this RLJob does not control. Pure.

The controller looks the children's names up before it writes any of them (ownership.name_conflicts);
with a conflict it writes nothing and the job waits with this condition, whose message names each
object, until its owner removes or renames it. The condition turns False once the names are free.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from ..ownership import NameConflict
from .conditions import set_condition, set_phase
from .context import Decision

NAME_CONFLICT = "NameConflict"
RETRY_SECONDS = 15.0
"""How soon a job with a conflict looks again: the other object is not ours, so no watch of ours sees it go."""


def with_name_conflicts(decision: Decision, conflicts: list[NameConflict], now: datetime) -> Decision:
    """`decision` with nothing created, NameConflict True and, for a job that was about to make its pods,
    the phase Pending with the same reason; without conflicts, NameConflict False where it was True."""
    status = decision.status.model_copy(deep=True)
    if not conflicts:
        held = any(c.type == NAME_CONFLICT and c.status == "True" for c in status.conditions)
        if not held:
            return decision
        set_condition(status, NAME_CONFLICT, "False", "NamesFree", "", now)
        return dataclasses.replace(decision, status=status)
    message = (
        "; ".join(c.sentence() for c in conflicts)
        + ": the operator touches only objects that are absent or controlled by this RLJob; delete or rename those, or rename the RLJob"
    )
    set_condition(status, NAME_CONFLICT, "True", NAME_CONFLICT, message, now)
    if decision.create_jobset or decision.create_initializer:
        set_phase(status, "Pending", NAME_CONFLICT, message, now)
    events = decision.events
    if not any(c.type == NAME_CONFLICT and c.status == "True" for c in decision.status.conditions):
        events = (*events, ("Warning", NAME_CONFLICT, message[:1000]))
    return dataclasses.replace(
        decision, status=status, create_jobset=False, create_initializer=False, events=events, requeue_after=RETRY_SECONDS, message=message
    )
