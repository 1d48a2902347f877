"""runPolicy.suspend: the pods go (each rank checkpoints at its step boundary on SIGTERM); resuming
makes them again, and they resume from that checkpoint."""

from __future__ import annotations

from .context import Context, Decision, finish
from .reading import name

ACTIVE_SECONDS = 2.0


def suspension(ctx: Context) -> Decision | None:
    if not ctx.job.spec.run_policy.suspend:
        return None
    children = tuple(f"jobset/{name(j)}" for j in ctx.observed.jobsets) + tuple(f"job/{name(j)}" for j in ctx.observed.jobs)
    ctx.status.start_time = None  # the deadline counts running time, as for a Kubernetes Job
    return finish(
        ctx,
        "Suspended",
        "Suspended",
        "suspended: pods removed, checkpoints kept",
        delete=children,
        requeue_after=ACTIVE_SECONDS if children else None,
    )
