"""The sandbox pods of a job that has stopped: none. Pure.

A finished (Succeeded, Failed) or suspended job runs no trainer, so its sandbox Deployment goes: it
is deleted rather than scaled to zero because the operator writes no support object of a finished job
any more (nothing would ever scale it back, nor need to), and a delete is the action every stopping
policy already takes for the JobSet. Idempotent: one that is already gone is a 404, ignored. A
resumed job gets it again with its other support objects (the planner leaves the Deployment out while
the job is suspended, so the periodic re-apply does not bring it back early).
"""

from __future__ import annotations

from ..api import RLJob
from ..sandbox_address import sandbox_name, wants_sandbox_pods
from .finished import TERMINAL

SANDBOX_KIND = "deployment"


def sandbox_deletions(job: RLJob, phase: str | None) -> tuple[str, ...]:
    """The children to delete so that a job in `phase` holds no sandbox pod: its Deployment once it has
    finished or while it is suspended; nothing otherwise."""
    if not wants_sandbox_pods(job):
        return ()
    if phase in TERMINAL or job.spec.run_policy.suspend:
        return (f"{SANDBOX_KIND}/{sandbox_name(job.metadata.name or '')}",)
    return ()
