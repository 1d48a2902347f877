"""A job that has succeeded or failed: stop what still runs, and delete the RLJob after its TTL."""

from __future__ import annotations

from datetime import timedelta

from .context import Context, Decision
from .reading import active, name

TERMINAL = ("Succeeded", "Failed")


def finished(ctx: Context) -> Decision | None:
    if ctx.old.phase not in TERMINAL:
        return None
    running = tuple(f"jobset/{name(j)}" for j in ctx.observed.jobsets) if active(ctx.observed.pods) else ()
    ttl = ctx.job.spec.run_policy.ttl_seconds_after_finished
    if ttl is not None and ctx.old.completion_time is not None:
        expires = ctx.old.completion_time + timedelta(seconds=ttl)
        if ctx.now >= expires:
            return Decision(status=ctx.status, delete_rljob=True, delete=running)
        return Decision(status=ctx.status, delete=running, requeue_after=(expires - ctx.now).total_seconds())
    return Decision(status=ctx.status, delete=running)
