"""Updates over rows that must stay together: preference pairs (chosen, rejected) in one micro-batch.

MegatronLM.train_plan cuts a mini-batch into DP shards and micro-batches by rows (or tokens); a
loss over pairs needs both rows of a pair in the same micro-batch. Here the plan counts units of
`unit` consecutive rows, the shards and micro-batches are whole units, and the totals are the
mini-batch's rows, as for any other update.
"""

from __future__ import annotations

from typing import Iterable

from .loss_scale import UpdateTotals
from .policy import LossFn, MegatronLM
from .sequences import MiniBatch, SeqBatch, micro_batches, shard_rows


def unit_rows(units: Iterable[int], unit: int) -> list[int]:
    """The rows of these units: unit u is rows unit*u .. unit*u + unit - 1."""
    return [unit * u + r for u in units for r in range(unit)]


def train_units(
    model: MegatronLM, batch: SeqBatch, plan: list[MiniBatch], loss_fn: LossFn, micro_batch_size: int, unit: int
) -> list[dict[str, float]]:
    """One update per mini-batch of `plan` (in units), each split over DP by whole units; a
    micro-batch holds micro_batch_size units. unit 1 is MegatronLM.train_plan."""
    if unit == 1:
        return model.train_plan(batch, plan, loss_fn, micro_batch_size)
    stats = []
    place = model.place
    for update in plan:
        units = range(update.start, update.end)
        mine = [units[i] for i in shard_rows(len(units), place.dp_rank, place.dp_size)]
        mbs = micro_batches(batch.select(unit_rows(mine, unit)), unit * micro_batch_size)
        totals = UpdateTotals.of(batch.select(unit_rows(units, unit)), len(mbs), place.dp_size)
        stats.append(model.train_step(mbs, loss_fn, update.lr, totals))
    return stats
