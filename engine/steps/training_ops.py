"""The StepContext's operations from the batch to the update, each returning a typed record
(batches.py): batch or pairs -> forward_roles -> advantages -> update."""

from __future__ import annotations

from typing import Any

import torch

from .. import algorithms as A
from ..algorithms.presets import AlgorithmChoice
from ..data import Example
from ..training.losses import MISMATCH_KEYS, mismatch_stats, policy_loss_fn
from ..training.optimizer import learning_rate
from ..training.policy import LossFn
from ..training.sequences import pack, update_plan
from ..training.token_stats import response_sum_pi_squared
from ..training.unit_updates import train_units
from ..training.update_stats import mean_of, mean_over
from .batches import Advantaged, Batch, Forwarded
from .records import Rollout, Scores


class TrainingOps:
    """Mixed into StepContext (context.py), which sets run, timer, config, choice and record."""

    def batch(self, rollout: Rollout) -> Batch:
        """The rollout as packed token rows, with vLLM's log-probs of the sampled tokens."""
        completions = rollout.completions
        rows = pack([rollout.prompts[c.prompt_index] for c in completions], [c.token_ids for c in completions], self.run.pad_id)
        rows.rollout_logprobs = _logprob_rows([c.logprobs for c in completions], rows.mask.shape[1])
        self.record.add(response_length_mean=rollout.tokens / max(1, len(completions)))
        return Batch(rows)

    def pairs(self, examples: list[Example]) -> Batch:
        """The examples' preference pairs as rows chosen, rejected (each ending in EOS), which stay
        together in every split of an update (a loss over pairs reads both)."""
        run = self.run
        eos = run.tokenizer.eos_token_id
        prompts, responses = [], []
        for e in examples:
            prompt = run.encoder.encode(e)
            for text in (e.chosen, e.rejected):
                prompts.append(prompt)
                responses.append(run.tokenizer.encode(text, add_special_tokens=False) + ([eos] if eos is not None else []))
        return Batch(pack(prompts, responses, run.pad_id), unit=2)

    def forward_roles(self, batch: Batch) -> Forwarded:
        """Reference log-probs and critic values where the job has them, the actor's own log-probs
        when old log-probs are recomputed, and the sum of its squared probabilities when the
        estimator reads it. Roles on ranks of their own get both questions before either answer is awaited."""
        run, access, rows = self.run, self.run.roles, batch.rows
        size = self.config.trainer.micro_batch_size
        self.to_training()
        if run.needs_ref:
            access.ask("ref", "logprobs", rows)
        if run.needs_critic:
            access.ask("critic", "values", rows)
        old = rows.rollout_logprobs
        if run.recompute_old_logprobs and rows.rollout_logprobs is not None:
            with self.timer("old_logprobs"):
                old = run.actor.rows_over_dp(run.actor.response_logprobs, rows, size)
            self.record.add({k: float(v) for k, v in mismatch_stats(old, rows.rollout_logprobs, rows.mask).items()})
        pi_squared = None
        if run.estimator is not None and run.estimator.needs_pi_squared:
            with self.timer("token_stats"):
                pi_squared = run.actor.rows_over_dp(lambda mbs: response_sum_pi_squared(run.actor, mbs), rows, size)
        ref = values = None
        if run.needs_ref:
            with self.timer("reference"):
                ref = access.rows("ref", run.ref, rows)
        if run.needs_critic:
            with self.timer("values"):
                values = access.rows("critic", run.critic, rows)
        return Forwarded(batch, old, ref, values, pi_squared)

    def advantages(
        self,
        forwarded: Forwarded,
        rollout: Rollout,
        scores: Scores,
        greedy: Scores | None = None,
        estimator: str | None = None,
        **options: Any,
    ) -> Advantaged:
        """The job's estimator (or `estimator` with `options`) over the batch: pure, the same on every
        rank. `greedy`: the scores of one greedy response per prompt (ReMax)."""
        algorithm, mask = self.config.algorithm, forwarded.batch.mask
        old, rollout_logprobs = forwarded.old_logprobs, forwarded.batch.rows.rollout_logprobs
        with self.timer("advantages"):
            penalty = None
            if forwarded.ref_logprobs is not None:
                kl = A.kl_estimate(old, forwarded.ref_logprobs, algorithm.kl_estimator) * mask
                self.record.add(kl=float(A.masked_mean(kl, mask)))
                penalty = algorithm.kl_coef * kl if algorithm.kl_in_reward else None
            weights = None
            if algorithm.tis is not None and rollout_logprobs is not None:
                weights = A.tis_weights(old, rollout_logprobs, mask, algorithm.tis.cap)
            group = rollout.group
            inputs = A.AdvantageInputs(
                scores=scores.values,
                group=group,
                mask=mask,
                values=forwarded.values,
                kl_penalty=penalty,
                greedy_scores=greedy.values[group] if greedy is not None else None,
                old_logprobs=old,
                sum_pi_squared=forwarded.sum_pi_squared,
                is_weights=weights,
                reward_parts=dict(scores.sources),
                reward_weights=dict(scores.weights),
            )
            name = estimator or self.choice.advantage
            out = A.advantage_estimator(name).fn(inputs, **(options if estimator else self.choice.advantage_options))
        return Advantaged(forwarded, out.advantages, out.returns)

    def loss(self, name: str, **options: Any) -> LossFn:
        """The registered policy loss `name` with these options (Python names), plus the job's KL and
        entropy terms: what `update(batch, loss=...)` takes in place of the job's own."""
        horizon = self.config.rollout.max_response_tokens if self.config.rollout is not None else 1
        return policy_loss_fn(self.config.algorithm, horizon, AlgorithmChoice(self.choice.advantage, {}, name, options, self.choice.step))

    def update(self, batch: Forwarded | Advantaged, loss: LossFn | None = None) -> None:
        """Mini-batch updates of the actor (and of the critic, given advantages with value targets) over
        the batch's rows, split over DP; `loss` (ctx.loss(...)) in place of the job's."""
        run, trainer, algorithm = self.run, self.config.trainer, self.config.algorithm
        rows, unit = batch.rows(), batch.batch.unit
        self.to_training()
        first, total = run.updates, run.total_updates()
        plan = update_plan(
            len(rows) // unit,
            trainer.mini_batch_size,
            algorithm.update_epochs,
            lambda i: learning_rate(trainer.optimizer, first + i, total),
        )
        run.updates += len(plan)
        train_critic = run.needs_critic and isinstance(batch, Advantaged)
        with self.timer("train"):
            if train_critic:
                run.roles.ask("critic", "train", {"batch": rows, "plan": plan})  # trains while the actor does
            per_update = train_units(run.actor, rows, plan, loss or run.policy_loss, trainer.micro_batch_size, unit)
            if run.switch is not None:
                run.switch.actor_changed()
            stats = mean_over(mean_of(per_update))
            first_stats = {k: per_update[0][k] for k in MISMATCH_KEYS if k in per_update[0]}
            for k in MISMATCH_KEYS:  # later updates compare a policy that has moved: not a mismatch
                stats.pop(k, None)
            if not run.recompute_old_logprobs and first_stats:
                # The first update's forward is the old policy: its mismatch with vLLM, on the first mini-batch.
                stats.update(mean_over(first_stats))
            self.record.add(stats)
            if train_critic:
                if run.critic is not None:
                    critic = mean_over(mean_of(run.critic.train_plan(rows, plan, run.value_loss, trainer.micro_batch_size)))
                else:
                    critic = run.roles.answer("critic")
                self.record.add({f"critic/{k}": v for k, v in critic.items()})

    def learning_rate(self) -> float:
        return learning_rate(self.config.trainer.optimizer, self.run.updates, self.run.total_updates())


def _logprob_rows(rows: list[list[float]], width: int) -> torch.Tensor:
    """Per-token log-prob lists as a [B, width] tensor, zero-padded on the right."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
