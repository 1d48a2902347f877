"""An admitted JobSet: its pods starting, running, or restarting after a failed pod.

Within one attempt the phase only moves forward, Starting then Running; a gang restart is Restarting, and the
next attempt starts again at Starting."""

from __future__ import annotations

from .context import Context, Decision, finish
from .count_events import GANG_RESTART
from .deadline import seconds_left
from .reading import failed_pod, of_attempt, record_failure

ACTIVE_SECONDS = 2.0
RESYNC_SECONDS = 30.0


def running(ctx: Context) -> Decision:
    if ctx.status.start_time is None:
        ctx.status.start_time = ctx.now
    wanted = ctx.job.spec.roles.pods()
    ready = sum(min(ctx.status.roles[r].ready, n) for r, n in wanted.items() if r in ctx.status.roles)
    total = sum(wanted.values())
    left = seconds_left(ctx)
    if ctx.jobset is not None:
        # Kept as soon as a pod of this attempt has failed: by the time JobSet counts the restart, it may have taken
        # the failed pod away already.
        record_failure(ctx.status, ctx.observed.failed_pods_too, ctx.jobset, ctx.status.restarts, ctx.observed.trainer_jobs)
    if ctx.status.restarts > ctx.old.restarts:
        limit = ctx.job.spec.run_policy.backoff_limit
        ended = (of_attempt(ctx.observed.failed_pods_too, ctx.jobset, back=1), of_attempt(ctx.observed.trainer_jobs, ctx.jobset, back=1))
        cause = failed_pod(*ended) or "a pod failed"
        if ctx.jobset is not None:
            record_failure(ctx.status, ctx.observed.failed_pods_too, ctx.jobset, ctx.status.restarts - 1, ctx.observed.trainer_jobs)
        message = f"{cause}; restarting every role from the last checkpoint (restart {ctx.status.restarts} of {limit})"
        return finish(ctx, "Restarting", "PodFailed", message, requeue_after=ACTIVE_SECONDS, events=(("Warning", GANG_RESTART, message),))
    if ready == total:
        requeue = RESYNC_SECONDS if left is None else min(RESYNC_SECONDS, left)
        return finish(ctx, "Running", "AllRanksRunning", f"all {total} pods are running", requeue_after=requeue)
    requeue = ACTIVE_SECONDS if left is None else min(ACTIVE_SECONDS, left)
    if ctx.old.phase == "Running":
        # Within an attempt the phase never goes back: a pod that just failed (JobSet has not restarted the
        # gang yet) or one that finished before the others is no reason to say Starting again.
        return finish(ctx, "Running", "PodsNotReady", f"{ready} of {total} pods ready", requeue_after=requeue)
    # A new attempt (after Restarting), or the first, starts.
    return finish(ctx, "Starting", "WaitingForPods", f"waiting for {total - ready} of {total} pods", requeue_after=requeue)
