"""A trainer container killed for running out of memory ends the job: a restart loads the same model
with the same limits and batch sizes, and would be killed the same way.

Kubernetes' own failure policies cannot tell this kill from the others: the container exits 137, as
it does when its pod is force-deleted, preempted or its node is lost, which a gang restart does
mend. Only the container's terminated reason (OOMKilled) says it. So the operator decides, from the
failed pods of the JobSet's current attempt and the one before it (JobSet may already have restarted
the gang: the new pods go with it)."""

from __future__ import annotations

from typing import Any

from kuberl.engine.config.termination import TRAINER_CONTAINER

from ..children import LABEL_ROLE
from .context import Context, Decision, finish
from .initialization import is_initializer
from .outcome import NOT_RETRIED
from .reading import attempt, name, of_attempt, record_pod

REASON = "OutOfMemory"


def oom_killed(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The trainer container's terminated state, when the kernel killed it for its memory."""
    for cs in pod.get("status", {}).get("containerStatuses", []):
        if cs.get("name") != TRAINER_CONTAINER:
            continue
        terminated = cs.get("state", {}).get("terminated") or cs.get("lastState", {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return terminated
    return None


def memory_limit(pod: dict[str, Any]) -> str | None:
    for container in pod.get("spec", {}).get("containers", []):
        if container.get("name") == TRAINER_CONTAINER:
            return ((container.get("resources") or {}).get("limits") or {}).get("memory")
    return None


def advice(role: str) -> str:
    return (
        f"give it more room: roles.{role}.resources.limits.memory, or fewer bytes per step: "
        "trainer.microBatchSize, rollout.kvCacheBytes, data.maxPromptLength"
    )


def out_of_memory(ctx: Context) -> Decision | None:
    jobset = ctx.jobset
    if jobset is None:
        return None
    pods = [p for p in ctx.observed.failed_pods_too if not is_initializer(p)]
    recent = of_attempt(pods, jobset) + of_attempt(pods, jobset, back=1)
    killed = next((p for p in sorted(recent, key=name) if oom_killed(p) is not None), None)
    if killed is None:
        return None
    # The killed pod itself, whatever its phase says yet (the kubelet reports the container's end first).
    record_pod(ctx.status, killed, attempt(killed, jobset))
    ctx.status.completion_time = ctx.now
    role = killed["metadata"].get("labels", {}).get(LABEL_ROLE, "?")
    limit = memory_limit(killed)
    message = (
        f"pod {name(killed)} (role {role}): its {TRAINER_CONTAINER} container was killed for running out of memory "
        f"({f'limit {limit}' if limit else 'no limit: the node ran out'}); {NOT_RETRIED}; {advice(role)}"
    )
    return finish(ctx, "Failed", REASON, message, delete=(f"jobset/{name(jobset)}",), events=(("Warning", REASON, message),))
