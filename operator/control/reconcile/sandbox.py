"""The sandbox pods of a job that has stopped: none. Pure.

A finished (Succeeded, Failed) or suspended job runs no trainer, so its sandbox Deployment (backend
agentSandbox: its SandboxWarmPool, whose Sandboxes and pods the garbage collector then takes) goes: it
is deleted rather than scaled to zero because the operator writes no support object of a finished job
any more (nothing would ever scale it back, nor need to), and a delete is the action every stopping
policy already takes for the JobSet. Idempotent: one that is already gone is a 404, ignored. A
resumed job gets it again with its other support objects (the planner leaves the Deployment out while
the job is suspended, so the periodic re-apply does not bring it back early).
"""

from __future__ import annotations

from ...api import RLJob
from ..sandbox_address import AGENT_SANDBOX, multi_turn, sandbox_name, wants_sandbox_pods
from .finished import TERMINAL

SANDBOX_KIND = "deployment"
WARM_POOL_KIND = "sandboxwarmpool"


def sandbox_deletions(job: RLJob, phase: str | None) -> tuple[str, ...]:
    """The children to delete so that a job in `phase` holds no sandbox pod: its Deployment (or SandboxWarmPool)
    once it has finished or while it is suspended; nothing otherwise."""
    spec = multi_turn(job)
    if spec is None or not wants_sandbox_pods(job):
        return ()
    if phase in TERMINAL or job.spec.run_policy.suspend:
        kind = WARM_POOL_KIND if spec.sandbox.backend == AGENT_SANDBOX else SANDBOX_KIND
        return (f"{kind}/{sandbox_name(job.metadata.name or '')}",)
    return ()
