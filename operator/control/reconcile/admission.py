"""Kueue's admission: a queued JobSet stays suspended, with no pod, until its whole Workload is admitted;
an admitted one that Kueue evicts (preempted, quota reclaimed, pods not ready in time) is suspended
again: its pods get SIGTERM and checkpoint at their step boundary, and the job waits to be admitted
again. Neither is a failure: restarts and backoffLimit are untouched, preemptions counted apart (and
reported by an event whichever policy decides: count_events.py)."""

from __future__ import annotations

from datetime import datetime

from .context import Context, Decision, finish
from .reading import admitted, suspended, waiting_reason

QUEUED_SECONDS = 5.0


def admission(ctx: Context) -> Decision | None:
    jobset = ctx.jobset
    if jobset is None or not ctx.job.spec.run_policy.scheduling.queue_name:
        return None
    now_admitted = admitted(ctx.observed.workloads)
    if not suspended(jobset) and now_admitted is not None:
        when = now_admitted.get("lastTransitionTime")
        if when:
            ctx.status.admitted_time = datetime.fromisoformat(when.replace("Z", "+00:00"))
        return None
    reason, message = waiting_reason(ctx.observed.workloads)
    queue = ctx.job.spec.run_policy.scheduling.queue_name
    ctx.status.start_time = None  # as for a suspended Job: the deadline counts admitted time
    if ctx.status.last_checkpoint is not None and ctx.status.preemptions:
        message += f"; it resumes from the checkpoint of step {ctx.status.last_checkpoint.step}"
    return finish(ctx, "Queued", reason, f"queue {queue}: {message}", requeue_after=QUEUED_SECONDS)
