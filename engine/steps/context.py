"""What a step function may do with the run: the operations of one RL step, typed end to end.

A step function (registry.py) calls these in the order it wants:

    examples = ctx.next_prompts()
    rollout = ctx.generate(examples)          # switches into generation mode when needed
    scores = ctx.score(rollout)               # the switch back to training runs meanwhile
    batch = ctx.batch(rollout)                # packed token rows, vLLM's log-probs attached
    ctx.forward_roles(batch)                  # reference log-probs, critic values, recomputed old log-probs
    ctx.advantages(batch, rollout, scores)    # the job's registered estimator
    ctx.update(batch)                         # actor and critic, mini-batches over DP

Every call is collective: all ranks of the actor's world call the same operations in the same
order (SPMD). Metrics go to `ctx.record`; phase times to `ctx.timer`. A multi-turn rollout would
be one more operation between generate and score (generation as a loop of turns, tool results
masked out of `batch.mask`); the operations after it only read the packed batch.
"""

from __future__ import annotations

import torch

from .. import algorithms as A
from ..algorithms.presets import AlgorithmChoice
from ..config.topology import EngineConfig
from ..data import Example
from ..rollout.vllm_backend import Sampling
from ..runtime.losses import MISMATCH_KEYS, mismatch_stats
from ..runtime.overlap import Background
from ..runtime.sequences import SeqBatch, pack, update_plan
from ..runtime.timer import Timer
from ..runtime.update_stats import mean_of, mean_over
from ..training.optimizer import learning_rate
from .records import Rollout, Scores, StepRecord
from .run_view import StepRun


class StepContext:
    def __init__(self, run: StepRun, timer: Timer, choice: AlgorithmChoice):
        self.run, self.timer, self.choice = run, timer, choice
        self.config: EngineConfig = run.config
        self.step = run.step
        """The index of this step (0 for the first)."""
        self.record = StepRecord()
        self._rollout_tokens = 0
        self._draws = 0

    # -- data -----------------------------------------------------------------------------------------

    def next_prompts(self) -> list[Example]:
        """The next batch of trainer.promptsPerStep examples of the seeded order (checkpointed)."""
        return self.run.loader.next_batch()

    def sampling(self, *, greedy: bool = False) -> Sampling:
        """The job's sampling settings; greedy: one deterministic response per prompt."""
        spec = self.config.rollout
        assert spec is not None
        if greedy:
            return Sampling(max_new_tokens=spec.max_new_tokens, temperature=0.0, stop_token_ids=self.run.stop_ids())
        return Sampling(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
                        top_k=spec.top_k, n=spec.samples_per_prompt, stop_token_ids=self.run.stop_ids())

    # -- generation and rewards ------------------------------------------------------------------------

    def generate(self, examples: list[Example], sampling: Sampling | None = None) -> Rollout:
        """Completions of every example's prompt with vLLM, on every replica for its share."""
        run = self.run
        with self.timer("reshard"):
            moved = run.switch.to_rollout()
        for key, value in moved.items():
            self.record.metrics[key] = self.record.metrics.get(key, 0.0) + value
        prompts = [run.encoder.encode(e) for e in examples]
        # The seed of the first draw is the step's (a resumed run draws alike); later draws of one step differ.
        seed = self.config.trainer.seed * 1_000_003 + self.step * 1009 + run.generator.replica + 7919 * self._draws
        self._draws += 1
        with self.timer("rollout"):
            completions = run.generator.generate(prompts, sampling or self.sampling(), seed)
        rollout = Rollout(list(examples), prompts, completions)
        self._rollout_tokens += rollout.tokens
        self.record.add(rollout_tokens_per_second=self._rollout_tokens / max(self.timer.seconds["rollout"], 1e-9))
        if run.generator.prefix_cache_hit_ratio is not None:
            self.record.add(rollout_prefix_cache_hit_ratio=run.generator.prefix_cache_hit_ratio)
        return rollout

    def score(self, rollout: Rollout, *, then_train: bool = True) -> Scores:
        """The job's reward of every completion (on the controller, broadcast). With then_train, the
        switch back to training runs while the rewards are scored."""
        run = self.run
        back = Background(run.switch.to_training) if then_train and run.switch.generating else None
        with self.timer("reward"):
            scores = run.score(rollout)
        if back is not None:
            with self.timer("switch_back"):  # what the scoring did not hide
                seconds, hidden = back.join()
            self._switch_back(seconds, hidden)
        return scores

    def to_training(self) -> None:
        """Back to training mode, in the foreground (after score(..., then_train=False))."""
        if self.run.switch.generating:
            started = self.timer.seconds.get("switch_back", 0.0)
            with self.timer("switch_back"):
                self.run.switch.to_training()
            self._switch_back(self.timer.seconds["switch_back"] - started, 0.0)

    def _switch_back(self, seconds: float, hidden: float) -> None:
        m = self.record.metrics
        m["switch_back_seconds"] = m.get("switch_back_seconds", 0.0) + seconds
        m["switch_back_hidden_seconds"] = m.get("switch_back_hidden_seconds", 0.0) + hidden
        switch = m.get("reshard_seconds", 0.0) + m["switch_back_seconds"]
        m["switch_hidden_share"] = m["switch_back_hidden_seconds"] / switch if switch > 0 else 0.0

    # -- the batch and the other models -------------------------------------------------------------------

    def batch(self, rollout: Rollout) -> SeqBatch:
        """The rollout as packed token rows, with vLLM's log-probs of the sampled tokens."""
        completions = rollout.completions
        batch = pack([rollout.prompts[c.prompt_index] for c in completions], [c.token_ids for c in completions], self.run.pad_id)
        batch.rollout_logprobs = _logprob_rows([c.logprobs for c in completions], batch.mask.shape[1])
        batch.old_logprobs = batch.rollout_logprobs
        self.record.add(response_length_mean=rollout.tokens / max(1, len(completions)))
        return batch

    def forward_roles(self, batch: SeqBatch) -> None:
        """Reference log-probs and critic values where the job has them, and the actor's own
        log-probs when old log-probs are recomputed. Roles on ranks of their own get both
        questions before either answer is awaited."""
        run, access = self.run, self.run.roles
        self.to_training()
        if run.needs_ref:
            access.ask("ref", "logprobs", batch)
        if run.needs_critic:
            access.ask("critic", "values", batch)
        if run.recompute_old_logprobs:
            with self.timer("old_logprobs"):
                batch.old_logprobs = run.actor.rows_over_dp(run.actor.response_logprobs, batch, self.config.trainer.micro_batch_size)
            self.record.add({k: float(v) for k, v in mismatch_stats(batch.old_logprobs, batch.rollout_logprobs, batch.mask).items()})
        if run.needs_ref:
            with self.timer("reference"):
                batch.ref_logprobs = access.rows("ref", run.ref, batch)
        if run.needs_critic:
            with self.timer("values"):
                batch.old_values = access.rows("critic", run.critic, batch)

    def advantages(self, batch: SeqBatch, rollout: Rollout, scores: Scores, greedy: Scores | None = None) -> None:
        """The job's estimator over the batch (pure, the same on every rank); sets batch.advantages and
        batch.returns. `greedy`: the scores of one greedy response per prompt (ReMax)."""
        algorithm = self.config.algorithm
        with self.timer("advantages"):
            kl = None
            if batch.ref_logprobs is not None:
                kl = A.kl_estimate(batch.old_logprobs, batch.ref_logprobs, algorithm.kl_estimator) * batch.mask
                self.record.add(kl=float(A.masked_mean(kl, batch.mask)))
            penalty = algorithm.kl_coef * kl if kl is not None and algorithm.kl_in_reward else None
            group = rollout.group
            inputs = A.AdvantageInputs(scores=scores.values, group=group, mask=batch.mask, values=batch.old_values,
                                       kl_penalty=penalty, greedy_scores=greedy.values[group] if greedy is not None else None)
            out = A.advantage_estimator(self.choice.advantage).fn(inputs, **self.choice.advantage_options)
            batch.advantages, batch.returns = out.advantages, out.returns

    # -- updates ---------------------------------------------------------------------------------------

    def update(self, batch: SeqBatch) -> None:
        """Mini-batch updates of the actor (and critic) over the batch's rows, split over DP."""
        run, trainer, algorithm = self.run, self.config.trainer, self.config.algorithm
        self.to_training()
        first, total = run.updates, run.total_updates()
        plan = update_plan(len(batch), trainer.mini_batch_size, algorithm.update_epochs,
                           lambda i: learning_rate(trainer.optimizer, first + i, total))
        run.updates += len(plan)
        with self.timer("train"):
            if run.needs_critic:
                run.roles.ask("critic", "train", {"batch": batch, "plan": plan})  # trains while the actor does
            per_update = run.actor.train_plan(batch, plan, run.policy_loss, trainer.micro_batch_size)
            run.switch.actor_changed()
            stats = mean_over(mean_of(per_update))
            first = {k: per_update[0][k] for k in MISMATCH_KEYS if k in per_update[0]}
            for k in MISMATCH_KEYS:  # later updates compare a policy that has moved: not a mismatch
                stats.pop(k, None)
            if not run.recompute_old_logprobs and first:
                # The first update's forward is the old policy: its mismatch with vLLM, on the first mini-batch.
                stats.update(mean_over(first))
            self.record.add(stats)
            if run.needs_critic:
                if run.critic is not None:
                    critic = mean_over(mean_of(run.critic.train_plan(batch, plan, run.value_loss, trainer.micro_batch_size)))
                else:
                    critic = run.roles.answer("critic")
                self.record.add({f"critic/{k}": v for k, v in critic.items()})

    def learning_rate(self) -> float:
        return learning_rate(self.config.trainer.optimizer, self.run.updates, self.run.total_updates())


def _logprob_rows(rows: list[list[float]], width: int) -> torch.Tensor:
    """Per-token log-prob lists as a [B, width] tensor, zero-padded on the right."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
    return out

