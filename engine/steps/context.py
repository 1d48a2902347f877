"""What a step function may do with the run: the operations of one RL step, typed end to end.

A step function (registry.py) calls these in the order it wants; each returns a record the next
one takes (batches.py), so the order is in the types:

    examples = ctx.next_prompts()
    rollout = ctx.generate(examples)            # switches into generation mode when needed
    scores = ctx.score(rollout)                 # the switch back to training runs meanwhile
    batch = ctx.batch(rollout)                  # packed token rows, vLLM's log-probs attached
    forwarded = ctx.forward_roles(batch)        # reference log-probs, critic values, recomputed old log-probs
    advantaged = ctx.advantages(forwarded, rollout, scores)   # the job's registered estimator
    ctx.update(advantaged)                      # actor and critic, mini-batches over DP

A step that trains on given preference pairs takes `ctx.pairs(examples)` for the batch and updates
the forwarded pairs directly. `ctx.update(batch, loss=ctx.loss(name, **options))` trains with another
registered loss than the job's. Every call is collective: all ranks of the actor's world call the
same operations in the same order (SPMD). Metrics go to `ctx.record`; phase times to `ctx.timer`.
"""

from __future__ import annotations

from ..algorithms.presets import AlgorithmChoice
from ..common.timer import Timer
from ..config.topology import EngineConfig
from .records import StepRecord
from .rollout_ops import RolloutOps
from .run_view import StepRun
from .training_ops import TrainingOps


class StepContext(RolloutOps, TrainingOps):
    def __init__(self, run: StepRun, timer: Timer, choice: AlgorithmChoice):
        self.run, self.timer, self.choice = run, timer, choice
        self.config: EngineConfig = run.config
        self.step = run.step
        """The index of this step (0 for the first)."""
        self.record = StepRecord()
        self._rollout_tokens = 0
        self._draws = 0
