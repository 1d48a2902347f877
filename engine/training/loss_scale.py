"""What one micro-batch's loss counts for in its update, so that an update does not depend on how
its mini-batch is cut into micro-batches and DP shards.

A loss aggregates over its own micro-batch (a mean over tokens, or over sequences); megatron-core's
schedule then divides it by the number of micro-batches and DDP averages the gradients over DP
ranks. Left at that, an update is a mean of per-micro-batch means: every micro-batch weighs the
same whatever it holds, so a token budget, another microBatchSize or another DP size would change
the training, not only its speed. Scaling each micro-batch's aggregate by its part of the whole
mini-batch's divisor (response tokens for token_mean, sequences for every other aggregation) and
undoing the two means makes the update the mini-batch's own aggregate however it is cut; verl
divides by the mini-batch's global token count for the same reason (the totals also reach a loss,
LossInputs.global_tokens and global_sequences).

What stays per micro-batch: a loss whose terms depend on statistics of the batch it sees
(clip_cov's and kl_cov's covariance over the batch's tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from .sequences import SeqBatch


def _responses(batch: SeqBatch) -> int:
    """Rows with at least one response token (the per-response aggregations count only those)."""
    return int((batch.mask.sum(-1) > 0).sum())


@dataclass(frozen=True)
class UpdateTotals:
    """The divisors of one update, the same on every rank that computes a part of it."""

    tokens: float
    """Response tokens of the whole mini-batch (every DP rank's rows)."""
    sequences: int
    """Responses of the whole mini-batch with at least one token."""
    micro_batches: int
    """Micro-batches this rank computes (megatron-core divides each loss by this)."""
    dp: int
    """DP ranks the gradients are averaged over."""
    rows: int = 0
    """Rows of the whole mini-batch, empty ones included (a loss with its own mean over rows, gmpo)."""

    @classmethod
    def of(cls, mini: SeqBatch, micro_batches: int, dp: int) -> "UpdateTotals":
        return cls(float(mini.mask.sum()), _responses(mini), max(1, micro_batches), dp, len(mini))

    @classmethod
    def alone(cls, batches: list[SeqBatch]) -> "UpdateTotals":
        """One rank computing these micro-batches on their own (no DP): forward-only passes and tests."""
        return cls(
            sum(float(mb.mask.sum()) for mb in batches),
            sum(_responses(mb) for mb in batches),
            max(1, len(batches)),
            1,
            sum(len(mb) for mb in batches),
        )

    def scale(self, mb: SeqBatch, aggregation: str | None) -> float:
        """The factor that turns `mb`'s own aggregate into its part of the mini-batch's.

        token_mean divides by tokens; token_sum by nothing (the mini-batch's sum is its parts'
        sum); every other aggregation by responses with at least one token (seq_mean_token_sum_norm's
        constant cancelling out); a loss with a fixed mean over rows (`aggregation` None) by rows."""
        if aggregation == "token_mean":
            local, total = float(mb.mask.sum()), self.tokens
        elif aggregation == "token_sum":
            local, total = 1.0, 1.0
        elif aggregation is None:
            local, total = float(len(mb)), float(self.rows or self.sequences)
        else:
            local, total = float(_responses(mb)), float(self.sequences)
        return local / max(total, 1.0) * self.micro_batches * self.dp
