"""Stopping a job gracefully: SIGTERM (what Kubernetes sends on pod deletion, eviction, preemption or
a node drain) and SIGINT (Ctrl-C) end the run at the next step boundary, with a checkpoint.

A signal only sets a flag. At every step boundary the ranks agree on it (a max over the actor's
world, after the controller has asked each role on ranks of its own for theirs), so every rank stops
after the same step: one rank saving while another starts the next step would hang them both. The
run then writes a checkpoint, tells the roles to stop, and every rank exits with 128 + the signal
(143 for SIGTERM), a failure to Kubernetes, so the operator restarts the gang and it resumes from that
checkpoint. A second signal of the same kind stops the process at once.

Before the steps begin (`StopRequest.steps_begin`, called where a run starts its loop or a role starts
serving), a signal ends the process at once with the same exit status: a rank that is still joining
its world or loading its model has nothing to save, and it may be blocked in a call that does not return
to Python (a rendezvous retrying a peer's name that no longer resolves), which would keep any Python
handler from running until the pod's grace period ran out, holding its GPUs all that time. So the
signal also wakes a thread of its own (through the signal wakeup fd, which the interpreter writes from
its C-level handler whatever the main thread is doing), and that thread ends the process.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from types import FrameType

log = logging.getLogger("kuberl.engine")

HANDLED = (signal.SIGTERM, signal.SIGINT)
EXIT_STOPPED = 128 + signal.SIGTERM  # a rank that stopped because a peer was signalled


class StopRequest:
    """The stop flag of one process, set by a signal handler, read at step boundaries."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._stepping = threading.Event()

    def install(self) -> "StopRequest":
        """Handle SIGTERM and SIGINT in this process (from its main thread)."""
        # Explicit handlers, whatever the dispositions this process inherited: a rank started from a
        # shell that ignores SIGINT (many CI runners) must still stop on it.
        for signum in HANDLED:
            signal.signal(signum, self._handle)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(reader, writer), name="kuberl-stop", daemon=True).start()
        return self

    def steps_begin(self) -> None:
        """From now on a signal waits for the step boundary (the run has state worth a checkpoint)."""
        self._stepping.set()

    def _watch(self, reader: socket.socket, writer: socket.socket) -> None:
        """`writer`: the wakeup fd's socket, held here so that it stays open as long as this thread runs."""
        received: dict[int, int] = {}
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in HANDLED:
                    continue
                received[signum] = received.get(signum, 0) + 1
                stepping = self._stepping.is_set()
                if not stepping or received[signum] > 1:
                    why = "second signal" if stepping else "before the first step: nothing to save"
                    # Not logging: its lock may be held by the main thread, which is not coming back.
                    os.write(2, f"kuberl: {signal.Signals(signum).name} {why}, exiting now\n".encode())
                    os._exit(128 + signum)

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
