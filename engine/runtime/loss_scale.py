"""What one micro-batch's loss counts for in its update, so that an update does not depend on how
its mini-batch is cut into micro-batches and DP shards.

A loss aggregates over its own micro-batch (a mean over tokens, or over sequences); megatron-core's
schedule then divides it by the number of micro-batches and DDP averages the gradients over DP
ranks. Left at that, an update is a mean of per-micro-batch means: every micro-batch weighs the
same whatever it holds, so a token budget, another microBatchSize or another DP size would change
the training, not only its speed. Scaling each micro-batch's aggregate by its part of the whole
mini-batch's divisor (response tokens for token_mean, sequences for every other aggregation) and
undoing the two means makes the update the mini-batch's own aggregate however it is cut; verl
divides by the mini-batch's global token count for the same reason.

What stays per micro-batch: a loss whose terms depend on statistics of the batch it sees
(clip_cov's and kl_cov's covariance over the batch's tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from .sequences import SeqBatch


@dataclass(frozen=True)
class UpdateTotals:
    """The divisors of one update, the same on every rank that computes a part of it."""

    tokens: float
    """Response tokens of the whole mini-batch (every DP rank's rows)."""
    sequences: int
    """Sequences of the whole mini-batch."""
    micro_batches: int
    """Micro-batches this rank computes (megatron-core divides each loss by this)."""
    dp: int
    """DP ranks the gradients are averaged over."""

    @classmethod
    def of(cls, mini: SeqBatch, micro_batches: int, dp: int) -> "UpdateTotals":
        return cls(float(mini.mask.sum()), len(mini), max(1, micro_batches), dp)

    @classmethod
    def alone(cls, batches: list[SeqBatch]) -> "UpdateTotals":
        """One rank computing these micro-batches on their own (no DP): forward-only passes and tests."""
        return cls(sum(float(mb.mask.sum()) for mb in batches), sum(len(mb) for mb in batches), max(1, len(batches)), 1)

    def scale(self, mb: SeqBatch, aggregation: str | None) -> float:
        """The factor that turns `mb`'s own aggregate into its part of the mini-batch's.

        token_mean divides by tokens; every other aggregation (and a loss with a fixed mean over
        sequences, `aggregation` None) by sequences, seq_mean_token_sum_norm's constant width
        cancelling out."""
        if aggregation == "token_mean":
            local, total = float(mb.mask.sum()), self.tokens
        else:
            local, total = float(len(mb)), float(self.sequences)
        return local / max(total, 1.0) * self.micro_batches * self.dp
