"""The events a counted change of the status reports: a preemption and a gang restart.

Each is derived from the status this reconcile writes against the one it read, whichever policy
decided: a count that rose is reported by the reconcile that writes it, whatever path that reconcile
took (Kueue may count an eviction while the Workload still says Admitted and the JobSet is not
suspended yet, or a restart may be first seen by the reconcile that fails the job). A later
reconcile reads the count as already written and reports nothing, so each is reported once.
"""

from __future__ import annotations

from typing import Any

from ...api import RLJobStatus
from .reading import condition

PREEMPTED = "Preempted"
GANG_RESTART = "GangRestart"

Event = tuple[str, str, str]


def preemption_message(workloads: list[dict[str, Any]], count: int) -> str:
    """Kueue's words for the eviction (its Evicted condition), when the Workload still has them."""
    evicted = next((c for w in workloads if (c := condition(w, "Evicted")) is not None), None)
    said = f"evicted by Kueue: {evicted.get('message', '')}".strip() if evicted is not None else "evicted by Kueue"
    return f"{said} (preemption {count})"


def count_events(old: RLJobStatus, new: RLJobStatus, workloads: list[dict[str, Any]], decided: tuple[Event, ...]) -> tuple[Event, ...]:
    """The events for the counts that rose from `old` to `new` and that `decided` (the deciding policy's
    events, which may say more about the same change) does not report already."""
    reasons = {reason for _, reason, _ in decided}
    events: list[Event] = []
    if new.preemptions > old.preemptions and PREEMPTED not in reasons:
        events.append(("Warning", PREEMPTED, preemption_message(workloads, new.preemptions)))
    if new.restarts > old.restarts and GANG_RESTART not in reasons:
        events.append(("Warning", GANG_RESTART, f"the gang restarted from the last checkpoint (restart {new.restarts})"))
    return tuple(events)
