"""The JobSet: made when there is none (after a resume, the old one must be gone first)."""

from __future__ import annotations

from .context import Context, Decision, finish

ACTIVE_SECONDS = 2.0


def creation(ctx: Context) -> Decision | None:
    if ctx.jobset is not None:
        return None
    going = [j for j in ctx.observed.jobsets if j["metadata"].get("deletionTimestamp")]
    if going:  # a suspended job's JobSet, still taking its pods down (foreground deletion)
        return finish(
            ctx, "Pending", "WaitingForOldPods", "waiting for the pods of the previous JobSet to stop", requeue_after=ACTIVE_SECONDS
        )
    queue = ctx.job.spec.run_policy.scheduling.queue_name
    message = f"creating the JobSet for queue {queue}" if queue else "creating the JobSet"
    return finish(ctx, "Pending", "Creating", message, create_jobset=True, requeue_after=ACTIVE_SECONDS)
