"""Keys of RLJobs to reconcile and the workers that take them: a key is never handed to two workers at once,
and a burst of events for one job costs one reconcile."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kubernetes.client.rest import ApiException

from .child_cache import Key

if TYPE_CHECKING:
    from .controller import OperatorMetrics, Reconciler

log = logging.getLogger("kuberl.operator")


@dataclass
class WorkQueue:
    """Keys to reconcile, each due at a time; a key is never handed to two workers at once."""

    due: dict[Key, float] = field(default_factory=dict)
    busy: set[Key] = field(default_factory=set)
    dirty: set[Key] = field(default_factory=set)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, key: Key, after: float = 0.0) -> None:
        if key in self.busy:
            if after == 0.0:
                self.dirty.add(key)  # run again as soon as the current pass ends
            else:
                self.due[key] = min(self.due.get(key, float("inf")), time.monotonic() + after)
            return
        self.due[key] = min(self.due.get(key, float("inf")), time.monotonic() + after)
        self.wakeup.set()

    async def get(self) -> Key:
        while True:
            now = time.monotonic()
            ready = [(t, k) for k, t in self.due.items() if t <= now and k not in self.busy]
            if ready:
                _, key = min(ready)
                del self.due[key]
                self.busy.add(key)
                return key
            waits = [t - now for k, t in self.due.items() if k not in self.busy]
            self.wakeup.clear()
            try:
                await asyncio.wait_for(self.wakeup.wait(), timeout=min(waits) if waits else None)
            except asyncio.TimeoutError:
                pass

    def done(self, key: Key) -> None:
        self.busy.discard(key)
        if key in self.dirty:
            self.dirty.discard(key)
            self.add(key)
        elif key in self.due:
            self.wakeup.set()


async def run_workers(queue: WorkQueue, reconciler: Reconciler, metrics: OperatorMetrics, workers: int) -> None:
    # A thread per worker of its own: the loop's default pool is smaller than some --workers, and a
    # reconcile waiting there for a thread would count that wait as its own time.
    threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kuberl-reconcile")
    loop = asyncio.get_running_loop()

    async def worker() -> None:
        failures: dict[Key, int] = {}
        while True:
            key = await queue.get()
            started = time.perf_counter()
            try:
                requeue = await loop.run_in_executor(threads, reconciler.reconcile, key)
                failures.pop(key, None)
                if requeue is not None:
                    queue.add(key, after=requeue)
            except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the operator
                metrics.errors.inc()
                count = failures[key] = failures.get(key, 0) + 1
                backoff = min(30.0, 0.5 * 2 ** (count - 1))
                if isinstance(exc, ApiException) and exc.status == 409:
                    log.debug("%s/%s: conflict, retrying", *key)
                    backoff = 0.1
                else:
                    log.exception("%s/%s: reconcile failed (retry in %.1f s)", *key, backoff)
                queue.add(key, after=backoff)
            finally:
                metrics.reconcile_seconds.observe(time.perf_counter() - started)
                queue.done(key)

    await asyncio.gather(*(worker() for _ in range(workers)))
