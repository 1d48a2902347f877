"""Policy versions and staleness: which batches may be generated ahead, and which may be trained on. Pure.

The policy's version is the number of steps whose update it has had: version v generated the tokens
of a batch when the trainer had finished v steps. A batch trained at step s (the trainer's version
is then s) is `s - v` versions behind, counted by its oldest token. With algorithm.async.maxStaleness
N the trainer never takes a batch more than N behind, so the batch of step k may be generated as
soon as the trainer reaches version k - N: at step s, batches up to step s + N may be on their way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class BatchVersions:
    """The versions that produced a batch's tokens (one entry per token)."""

    versions: tuple[int, ...]

    @property
    def oldest(self) -> int:
        return min(self.versions)


def staleness(current: int, oldest: int) -> int:
    """Versions between the policy that trains (`current`) and the oldest token's (`oldest`)."""
    if oldest > current:
        raise ValueError(f"a token of version {oldest} cannot be ahead of the policy's version {current}")
    return current - oldest


def may_consume(current: int, oldest: int, max_staleness: int) -> bool:
    """Whether the trainer at version `current` may train on a batch whose oldest token is of version `oldest`."""
    return staleness(current, oldest) <= max_staleness


def steps_to_issue(step: int, issued_through: int, max_staleness: int, total_steps: int) -> range:
    """The steps whose batches may be issued now, at the start of `step` (the policy is then of version
    `step`), given that batches through step `issued_through` (-1: none) are already on their way:
    every step up to step + max_staleness, never past the last step."""
    last = min(step + max_staleness, total_steps - 1)
    return range(max(issued_through + 1, step), last + 1)


def staleness_metrics(current: int, token_versions: Iterable[Iterable[int]]) -> dict[str, float]:
    """A batch's staleness for the metrics: of its oldest token (`staleness`), the token mean, and the
    number of tokens at each distance (`staleness_tokens/<n>`: the histogram)."""
    counts: Counter[int] = Counter()
    for versions in token_versions:
        counts.update(staleness(current, v) for v in versions)
    total = sum(counts.values())
    if not total:
        return {}
    out = {"staleness": float(max(counts)), "staleness_mean": sum(k * n for k, n in counts.items()) / total}
    out.update({f"staleness_tokens/{k}": float(n) for k, n in sorted(counts.items())})
    return out
