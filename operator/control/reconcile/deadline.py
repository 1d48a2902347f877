"""runPolicy.activeDeadlineSeconds: a job that has run longer fails, and its pods go."""

from __future__ import annotations

from datetime import timedelta

from .context import Context, Decision, finish
from .reading import name


def deadline(ctx: Context) -> Decision | None:
    seconds = ctx.job.spec.run_policy.active_deadline_seconds
    if seconds is None or ctx.status.start_time is None:
        return None
    if ctx.now < ctx.status.start_time + timedelta(seconds=seconds):
        return None
    ctx.status.completion_time = ctx.now
    children = tuple(f"jobset/{name(j)}" for j in ctx.observed.jobsets) + tuple(f"job/{name(j)}" for j in ctx.observed.jobs)
    return finish(
        ctx,
        "Failed",
        "DeadlineExceeded",
        f"ran longer than activeDeadlineSeconds ({seconds} s)",
        delete=children,
        events=(("Warning", "DeadlineExceeded", f"stopped after {seconds} s"),),
    )


def seconds_left(ctx: Context) -> float | None:
    """Until the deadline, for the next look; None when the job has none (or its clock is not running)."""
    seconds = ctx.job.spec.run_policy.active_deadline_seconds
    if seconds is None or ctx.status.start_time is None:
        return None
    return max(0.0, (ctx.status.start_time + timedelta(seconds=seconds) - ctx.now).total_seconds())
