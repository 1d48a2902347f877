"""Direct preference optimisation's step: preference pairs against the reference, no rollout."""

from __future__ import annotations

from typing import Iterable

import torch

from .. import algorithms as A
from ..config.algorithm import DPOSpec
from ..runtime.loss_scale import UpdateTotals
from ..runtime.policy import response_logprobs_from_logits
from ..runtime.update_stats import mean_of, mean_over
from ..runtime.sequences import SeqBatch, micro_batches, pack, shard_rows
from .context import StepContext
from .registry import register_step


@register_step("dpo", on_policy=False, summary="DPO on the data's chosen/rejected pairs against the reference policy")
def dpo(ctx: StepContext) -> None:
    run, trainer = ctx.run, ctx.config.trainer
    spec = ctx.config.algorithm.dpo or DPOSpec()
    examples = ctx.next_prompts()
    eos = run.tokenizer.eos_token_id
    prompts, responses = [], []
    for e in examples:  # rows alternate: chosen, rejected of the same pair
        p = run.encoder.encode(e)
        for text in (e.chosen, e.rejected):
            prompts.append(p)
            responses.append(run.tokenizer.encode(text, add_special_tokens=False) + ([eos] if eos is not None else []))
    batch = pack(prompts, responses, run.pad_id)
    run.roles.ask("ref", "logprobs", batch)
    with ctx.timer("reference"):
        batch.ref_logprobs = run.roles.rows("ref", run.ref, batch)
    # For dpo the batch sizes count pairs: a micro-batch of k pairs holds 2k rows.
    pairs = len(examples)
    size = trainer.mini_batch_size or pairs

    def loss_fn(logits: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
        seq = response_logprobs_from_logits(logits, mb).sum(-1)
        ref_seq = (mb.ref_logprobs * mb.mask).sum(-1)
        loss, st = A.dpo_loss(seq[0::2], seq[1::2], ref_seq[0::2], ref_seq[1::2], spec.beta, spec.label_smoothing)
        # A mean over pairs: the micro-batch's part of the mini-batch is its share of the rows.
        return loss * totals.scale(mb, None), {"dpo_loss": loss.detach(), **st}

    updates = []
    with ctx.timer("train"):
        for start in range(0, pairs, size):
            mini = range(start, min(start + size, pairs))
            mine = shard_rows(len(mini), run.dp_rank, run.dp_size)
            lr = ctx.learning_rate()
            mbs = micro_batches(batch.select(_pair_rows(mini[p] for p in mine)), 2 * trainer.micro_batch_size)
            totals = UpdateTotals.of(batch.select(_pair_rows(mini)), len(mbs), run.dp_size)
            updates.append(run.actor.train_step(mbs, loss_fn, lr, totals))
            run.updates += 1
    ctx.record.add({"lr": lr, **mean_over(mean_of(updates))})


def _pair_rows(pairs: Iterable[int]) -> list[int]:
    """The batch rows of these preference pairs: chosen, then rejected."""
    return [r for p in pairs for r in (2 * p, 2 * p + 1)]
