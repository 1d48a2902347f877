"""The operator's decisions: observed children in, the RLJob's new status and the actions out. Pure.

Level-based: `decide` looks only at what exists now (the RLJob, its JobSet, initializer, pods and
Workload, the progress the controller rank reported) and never at the event that woke it, so running
it twice, or after an operator restart halfway through, converges to the same place.

A reconcile is a list of policies, in order, each in a module of its own; the first that decides ends
it, and the last (running) always decides:

    finished        a Succeeded or Failed job: stop what runs, delete after the TTL
    suspension      runPolicy.suspend: the pods go, checkpoints stay
    initialization  the initializer fills the cache before any trainer pod
    creation        the JobSet, when there is none
    admission       Kueue: queued with no pod, or evicted and waiting again (its clock stopped)
    deadline        runPolicy.activeDeadlineSeconds, counted while the job may run
    out_of_memory   a trainer container killed for its memory: ended, not restarted
    outcome         the JobSet completed, or failed after its last gang restart
    running         starting, running, restarting after a failed pod

Whatever decides, a finished or suspended job's sandbox Deployment is deleted (sandbox.py).

Counts are level-based too: the gang restarts are the JobSet's own (plus those before it, kept in its
annotations when a resumed job's JobSet is made again), the preemptions Kueue's on the Workload. A count
that rises is reported by an event of the reconcile that writes it, whichever policy decides
(count_events.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from ...api import RLJob, RLJobStatus
from .admission import admission
from .conditions import CONDITION_TYPES, INITIALIZED
from .context import Context, Decision, Observed
from .count_events import count_events
from .creation import creation
from .deadline import deadline
from .finished import TERMINAL, finished
from .initialization import initialization, is_initializer
from .out_of_memory import out_of_memory
from .outcome import outcome
from .reading import apply_progress, evictions, of_attempt, restarts, role_counts
from .running import running
from .sandbox import sandbox_deletions
from .suspension import suspension

__all__ = ["CONDITION_TYPES", "INITIALIZED", "TERMINAL", "Decision", "Observed", "decide"]

POLICIES = (finished, suspension, initialization, creation, admission, deadline, out_of_memory, outcome)


def decide(job: RLJob, observed: Observed, now: datetime) -> Decision:
    old = job.status or RLJobStatus()
    status = old.model_copy(deep=True)
    if job.metadata.generation is not None:
        status.observed_generation = job.metadata.generation
    live = [j for j in observed.jobsets if not j["metadata"].get("deletionTimestamp")]
    jobset = live[0] if live else None
    pods = [p for p in observed.pods if not is_initializer(p)]
    if jobset is not None:
        pods = of_attempt(pods, jobset)
        status.restarts = max(status.restarts, restarts(jobset))
        status.preemptions = max(status.preemptions, evictions(observed.workloads, jobset))
    status.roles = role_counts(pods)
    refused = apply_progress(status, observed.progress)
    ctx = Context(job=job, observed=observed, now=now, old=old, status=status, jobset=jobset, pods=pods)
    decision = next((d for d in (policy(ctx) for policy in POLICIES) if d is not None), None) or running(ctx)
    stop = tuple(c for c in sandbox_deletions(job, decision.status.phase) if c not in decision.delete)
    events = decision.events + count_events(old, decision.status, observed.workloads, decision.events)
    return replace(decision, delete=decision.delete + stop, progress_refused=refused, events=events)
