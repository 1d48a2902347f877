"""The JobSet's end: its actor's Job completed (Succeeded), or it failed after its last gang restart."""

from __future__ import annotations

from .context import Context, Decision, finish
from .reading import condition, failed_pod, name


def outcome(ctx: Context) -> Decision | None:
    jobset = ctx.jobset
    if jobset is None:
        return None
    if condition(jobset, "Completed") is not None:
        ctx.status.completion_time = ctx.now
        return finish(ctx, "Succeeded", "Completed", "the actor finished training", events=(("Normal", "Completed", "training finished"),))
    failed = condition(jobset, "Failed")
    if failed is None:
        return None
    ctx.status.completion_time = ctx.now
    limit = ctx.job.spec.run_policy.backoff_limit
    cause = failed_pod(ctx.observed.pods) or failed.get("message") or "a pod failed"
    message = f"{cause}; backoffLimit {limit} reached after {ctx.status.restarts} restart(s)"
    # Whatever still runs (a role whose Job had not failed) stops.
    return finish(ctx, "Failed", "BackoffLimitExceeded", message, delete=(f"jobset/{name(jobset)}",),
                  events=(("Warning", "BackoffLimitExceeded", message),))
