"""The StepContext's operations before the batch: prompts, generation, rewards, the switch back."""

from __future__ import annotations

from ..common.overlap import Background
from ..data import Example
from ..rollout.fleet_load import fleet_load_metrics
from ..rollout.staleness import may_consume, staleness_metrics
from ..rollout.vllm_backend import Sampling
from .async_rollout import sampling_seed
from .multi_turn import generate_multi_turn
from .records import Rollout, Scores


class RolloutOps:
    """Mixed into StepContext (context.py), which sets run, timer, config, step and record."""

    def next_prompts(self) -> list[Example]:
        """The next batch of trainer.promptsPerStep examples of the seeded order (checkpointed). With
        rollout.placement: separate, the batch asked of the fleet for this step (async_rollout.py)."""
        if self.run.pipeline is not None:
            return self.run.pipeline.examples(self)
        return self.run.loader.next_batch()

    def sampling(self, *, greedy: bool = False) -> Sampling:
        """The job's sampling settings; greedy: one deterministic response per prompt."""
        spec = self.config.rollout
        assert spec is not None
        if greedy:
            return Sampling(max_new_tokens=spec.max_new_tokens, temperature=0.0, stop_token_ids=self.run.stop_ids())
        return Sampling(
            max_new_tokens=spec.max_new_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k,
            n=spec.samples_per_prompt,
            stop_token_ids=self.run.stop_ids(),
        )

    def switch_to_rollout(self) -> None:
        """The weights into the rollout engine (timed as reshard); the bytes it moved add to the step's metrics."""
        with self.timer("reshard"):
            moved = self.run.switch.to_rollout()
        for key, value in moved.items():
            self.record.metrics[key] = self.record.metrics.get(key, 0.0) + value

    def draw_seed(self) -> int:
        """The sampling seed of this step's next draw: the first is the step's (a resumed run draws
        alike); later draws of one step (dynamic sampling) differ."""
        replica = self.run.generator.replica if self.run.generator is not None else 0  # the fleet adds its replicas'
        seed = sampling_seed(self.config.trainer.seed, self.step, replica, self._draws)
        self._draws += 1
        return seed

    def generate(self, examples: list[Example], sampling: Sampling | None = None) -> Rollout:
        """Completions of every example's prompt with vLLM, on every replica for its share (a
        multi-turn job's trajectories: multi_turn.py)."""
        run = self.run
        if run.multi_turn is not None:
            return generate_multi_turn(self, examples, sampling)
        if run.fleet is not None:
            return self._generate_on_fleet(examples, sampling)
        self.switch_to_rollout()
        prompts = [run.encoder.encode(e) for e in examples]
        seed = self.draw_seed()
        with self.timer("rollout"):
            completions = run.generator.generate(prompts, sampling or self.sampling(), seed)
        rollout = Rollout(list(examples), prompts, completions)
        self._rollout_tokens += rollout.tokens
        self.record.add(rollout_tokens_per_second=self._rollout_tokens / max(self.timer.seconds["rollout"], 1e-9))
        if run.generator.prefix_cache_hit_ratio is not None:
            self.record.add(rollout_prefix_cache_hit_ratio=run.generator.prefix_cache_hit_ratio)
        return rollout

    def _generate_on_fleet(self, examples: list[Example], sampling: Sampling | None) -> Rollout:
        """The rollout role's completions (rollout.placement: separate): this step's batch as the pipeline
        asked for it, or (another draw: validation) one asked now, with the current weights. Refuses a
        batch further behind than algorithm.async.maxStaleness; records its staleness."""
        run = self.run
        issued = run.pipeline.take(self.step, examples) if sampling is None else None
        if issued is not None:
            self._draws += 1
            prompts = issued.prompts
            with self.timer("rollout"):  # what the trainer waited for the fleet
                completions = run.pipeline.completions(issued)
        else:
            prompts = [run.encoder.encode(e) for e in examples]
            with self.timer("weight_sync"):
                run.fleet.sync(self.step)
            ticket = run.fleet.submit(prompts, sampling or self.sampling(), self.draw_seed())
            with self.timer("rollout"):
                completions = run.fleet.result(ticket)
        versions = [c.versions or () for c in completions]
        oldest = min((min(v) for v in versions if v), default=self.step)
        bound = run.pipeline.max_staleness
        if not may_consume(self.step, oldest, bound):
            raise RuntimeError(
                f"a batch of version {oldest} is {self.step - oldest} versions behind the policy "
                f"(version {self.step}); algorithm.async.maxStaleness is {bound}"
            )
        self.record.add(staleness_metrics(self.step, versions))
        self.record.add(rollout_version=float(oldest))
        if issued is not None:  # a training batch reports the weights sent since the last one (validation's too)
            self.record.add(run.fleet.sync_metrics())
            # The fleet's load: its replicas' accounts that came with this batch, and the batches still on their way.
            self.record.add(fleet_load_metrics(issued.ticket.loads if issued.ticket is not None else []))
            self.record.add(rollout_queue_depth=float(len(run.pipeline.issued)))
        rollout = Rollout(list(examples), prompts, completions)
        self._rollout_tokens += rollout.tokens
        return rollout

    def score(self, rollout: Rollout, *, then_train: bool = True) -> Scores:
        """The job's reward of every completion (on the controller, broadcast). With then_train, the
        switch back to training runs while the rewards are scored."""
        run = self.run
        back = Background(run.switch.to_training) if then_train and run.switch is not None and run.switch.generating else None
        with self.timer("reward"):
            scores = run.score(rollout)
        if back is not None:
            with self.timer("switch_back"):  # what the scoring did not hide
                seconds, hidden = back.join()
            self._switch_back(seconds, hidden)
        return scores

    def to_training(self) -> None:
        """Back to training mode, in the foreground (after score(..., then_train=False))."""
        if self.run.switch is not None and self.run.switch.generating:
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
