"""Work that runs in the background of the step loop, and how much of it the loop did not wait for."""

from __future__ import annotations

import threading
import time
from typing import Callable

import torch


class Background:
    """Runs `work` in a thread from now on; `join` waits for it and reports its time and the part of
    that time the caller spent on other work (hidden) rather than waiting."""

    def __init__(self, work: Callable[[], None]):
        # CUDA's current device is per thread: the worker thread works on the caller's device.
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.ended = self.started
        self.thread = threading.Thread(target=self._run, args=(work,), name="kuberl-background", daemon=True)
        self.thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            if self.device is not None:
                torch.cuda.set_device(self.device)
            work()
        except BaseException as exc:  # raised again in the caller's thread by join()
            self.error = exc
        finally:
            self.ended = time.perf_counter()

    def join(self) -> tuple[float, float]:
        """(seconds the work took, seconds of it the caller did not wait for)."""
        waiting_from = time.perf_counter()
        self.thread.join()
        if self.error is not None:
            raise self.error
        seconds = self.ended - self.started
        exposed = min(seconds, max(0.0, self.ended - waiting_from))
        return seconds, seconds - exposed
