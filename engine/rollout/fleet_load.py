"""How busy a rollout fleet on ranks of its own was (rollout.placement: separate), for the metrics.

Each rollout replica times itself (ReplicaClock): the seconds it spent on the controller's commands
(generating, loading weights) and the seconds it waited for the next one. A batch's reply carries every
replica's account since its previous reply; a step reports the accounts that came with its own batch
(fleet_load_metrics, pure). Validation's batches take their accounts too: a step's account starts at
the replica's previous batch, whichever it was.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator


@dataclass(frozen=True)
class ReplicaLoad:
    """One rollout replica's account since its previous reply."""

    replica: int
    tokens: int
    """Tokens it generated."""
    generate_seconds: float
    """Seconds it spent generating them."""
    busy_seconds: float
    """Seconds it spent on commands: generating, loading weights, answering."""
    idle_seconds: float
    """Seconds it waited for a command."""


class ReplicaClock:
    """This replica's account of its time since its last reply: busy on commands or waiting for one."""

    def __init__(self, replica: int, now: Callable[[], float] = time.perf_counter):
        self.replica, self.now = replica, now
        self.idle_from: float | None = now()
        self.started = self.idle = self.busy = self.generate_seconds = 0.0
        self.tokens = 0

    @contextmanager
    def command(self) -> Iterator[None]:
        self.started = self.now()
        if self.idle_from is not None:
            self.idle += self.started - self.idle_from
        self.idle_from = None
        try:
            yield
        finally:
            self.idle_from = self.now()
            self.busy += self.idle_from - self.started

    def generated(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.generate_seconds += seconds

    def take(self) -> ReplicaLoad:
        """The account so far (the command under way counted up to now), and a new one from now."""
        now = self.now()
        load = ReplicaLoad(self.replica, self.tokens, self.generate_seconds, self.busy + now - self.started, self.idle)
        self.started, self.idle, self.busy, self.generate_seconds, self.tokens = now, 0.0, 0.0, 0.0, 0
        return load


def fleet_load_metrics(loads: Iterable[ReplicaLoad]) -> dict[str, float]:
    """The fleet's share of time idle (`rollout_idle_fraction`), each replica's generated tokens per
    second (`rollout_replica/<i>/tokens_per_second`) and the slowest replica's, over the accounts given."""
    tokens: dict[int, int] = {}
    seconds: dict[int, float] = {}
    idle = busy = 0.0
    for load in loads:
        tokens[load.replica] = tokens.get(load.replica, 0) + load.tokens
        seconds[load.replica] = seconds.get(load.replica, 0.0) + load.generate_seconds
        idle += load.idle_seconds
        busy += load.busy_seconds
    if not tokens:
        return {}
    rates = {r: tokens[r] / seconds[r] for r in sorted(tokens) if seconds[r] > 0}
    out = {f"rollout_replica/{r}/tokens_per_second": rate for r, rate in rates.items()}
    if rates:
        out["rollout_replica_tokens_per_second_min"] = min(rates.values())
    if idle + busy > 0:
        out["rollout_idle_fraction"] = idle / (idle + busy)
    return out


def trainer_idle_fraction(waited_seconds: float, step_seconds: float) -> float:
    """The share of a step the trainers spent waiting for the fleet's batches."""
    if step_seconds <= 0:
        return 0.0
    return min(1.0, max(0.0, waited_seconds / step_seconds))
