"""The JobSet's end: its actor's Job completed (Succeeded), or it failed: at once, where a rank said a
restart cannot help, or after its last gang restart."""

from __future__ import annotations

from .context import Context, Decision, finish
from .reading import condition, failed_pod, name, not_retryable, of_attempt, record_failure

NOT_RETRIED = "not retried: a restart would fail the same way"


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
    record_failure(ctx.status, ctx.observed.failed_pods_too, jobset, ctx.status.restarts, ctx.observed.trainer_jobs)
    permanent = not_retryable(ctx.observed.failed_pods_too)
    if permanent is not None:
        pod, failure = permanent
        reason = failure.reason if failure is not None and not failure.retryable else "NotRetryable"
        said = (
            f"pod {pod} (role {failure.role}, rank {failure.rank}): {failure.message}"
            if failure is not None
            else failed_pod(ctx.observed.pods) or f"pod {pod} failed"
        )
        message = f"{said}; {NOT_RETRIED}"
        return finish(ctx, "Failed", reason, message, delete=(f"jobset/{name(jobset)}",), events=(("Warning", reason, message),))
    limit = ctx.job.spec.run_policy.backoff_limit
    cause = (
        failed_pod(of_attempt(ctx.observed.failed_pods_too, jobset), of_attempt(ctx.observed.trainer_jobs, jobset))
        or failed.get("message")
        or "a pod failed"
    )
    message = f"{cause}; backoffLimit {limit} reached after {ctx.status.restarts} restart(s)"
    # Whatever still runs (a role whose Job had not failed) stops.
    return finish(
        ctx,
        "Failed",
        "BackoffLimitExceeded",
        message,
        delete=(f"jobset/{name(jobset)}",),
        events=(("Warning", "BackoffLimitExceeded", message),),
    )
