"""The typed records of a step's batch, each made by one StepContext operation from the one before:

    ctx.batch(rollout) / ctx.pairs(examples) -> Batch        packed token rows (and vLLM's log-probs)
    ctx.forward_roles(batch)                 -> Forwarded    + old, reference log-probs, critic values
    ctx.advantages(forwarded, ...)           -> Advantaged   + advantages, value targets
    ctx.update(forwarded or advantaged)                      the update reads what its loss needs

so that what must run before what is in the types, and no operation changes another's record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..training.sequences import SeqBatch


@dataclass(frozen=True)
class Batch:
    """Packed prompt + response rows. `unit` consecutive rows stay together in every split of an
    update (2 for preference pairs: chosen, rejected)."""

    rows: SeqBatch
    unit: int = 1

    @property
    def mask(self) -> torch.Tensor:
        return self.rows.mask

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Forwarded:
    """A batch with what the other models (and the actor before its update) computed of it."""

    batch: Batch
    old_logprobs: torch.Tensor | None = None
    """The old policy's: vLLM's or recomputed (algorithm.oldLogprobs); None for given pairs."""
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    """The critic's values of the response tokens."""
    sum_pi_squared: torch.Tensor | None = None
    """The old policy's sum of squared probabilities per token (estimators with needs_pi_squared)."""

    def rows(self) -> SeqBatch:
        return replace(self.batch.rows, old_logprobs=self.old_logprobs, ref_logprobs=self.ref_logprobs, old_values=self.values)


@dataclass(frozen=True)
class Advantaged:
    """A forwarded batch with its advantages (and the critic's targets, where it has one)."""

    forwarded: Forwarded
    advantages: torch.Tensor
    returns: torch.Tensor | None = None

    @property
    def batch(self) -> Batch:
        return self.forwarded.batch

    def rows(self) -> SeqBatch:
        return replace(self.forwarded.rows(), advantages=self.advantages, returns=self.returns)
