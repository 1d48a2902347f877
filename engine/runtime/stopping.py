"""Stopping a job gracefully: SIGTERM (what Kubernetes sends on pod deletion, eviction, preemption or
a node drain) and SIGINT (Ctrl-C) end the run at the next step boundary, with a checkpoint.

A signal only sets a flag. At every step boundary the ranks agree on it (a max over the actor's
world, after the controller has asked each role on ranks of its own for theirs), so every rank stops
after the same step: one rank saving while another starts the next step would hang them both. The
run then writes a checkpoint, tells the roles to stop, and every rank exits with 128 + the signal
(143 for SIGTERM), a failure to Kubernetes, so the operator restarts the gang and it resumes from that
checkpoint. A second signal of the same kind stops the process at once.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

log = logging.getLogger("kuberl.engine")

HANDLED = (signal.SIGTERM, signal.SIGINT)
EXIT_STOPPED = 128 + signal.SIGTERM  # a rank that stopped because a peer was signalled


class StopRequest:
    """The stop flag of one process, set by a signal handler, read at step boundaries."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> "StopRequest":
        # Explicit handlers, whatever the dispositions this process inherited: a rank started from a
        # shell that ignores SIGINT (many CI runners) must still stop on it.
        for signum in HANDLED:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum == signum:
            log.warning("second %s: stopping now, without a checkpoint", signal.Signals(signum).name)
            raise SystemExit(128 + signum)
        self.signum = signum
        log.warning("%s received: stopping after the current step, with a checkpoint", signal.Signals(signum).name)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def exit_code(self) -> int:
        return 128 + self.signum if self.signum is not None else EXIT_STOPPED


def agree(local: bool) -> bool:
    """True on every rank of the default group when any rank asks to stop (a collective: all call it)."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
