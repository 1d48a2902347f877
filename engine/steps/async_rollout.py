"""The batches of the coming steps on roles.rollout (rollout.placement: separate), up to maxStaleness ahead.

At the start of step s the policy is of version s. The batches of steps s .. s + maxStaleness may be
on their way (rollout/staleness.py): those not yet asked for are drawn from the loader, in step
order, and sent to the fleet with the weights of version s, before this step's update begins; the
rollout ranks then generate while the actor trains. With maxStaleness 0 each batch is asked for at
its own step, with that step's weights: the synchronous run, sample for sample.

A checkpoint records the loader where it stood before the first batch still on its way, so a
resumed run asks for those prompts again: none is lost or trained twice (they are then generated
with the resumed policy, not the one that first asked for them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..data import Example
from ..distributed.rollout_fleet import RolloutFleet, Ticket
from ..rollout.staleness import steps_to_issue

if TYPE_CHECKING:
    from .context import StepContext


def sampling_seed(seed: int, step: int, replica: int, draws: int) -> int:
    """The sampling seed of a step's draw on one replica: the same wherever the replica runs, so that a
    resumed run, and a run that generates on ranks of its own, draw alike."""
    return seed * 1_000_003 + step * 1009 + replica + 7919 * draws


@dataclass(frozen=True)
class Issued:
    """A step's batch, asked of the fleet."""

    step: int
    examples: list[Example]
    prompts: list[list[int]]
    ticket: Ticket


class GenerationPipeline:
    def __init__(self, fleet: RolloutFleet, max_staleness: int, total_steps: int):
        self.fleet, self.max_staleness, self.total_steps = fleet, max_staleness, total_steps
        self.issued: dict[int, Issued] = {}
        self.issued_through = -1
        """The last step whose batch has been asked for (-1: none)."""
        self.loader_before: dict[int, dict[str, Any]] = {}
        """The loader's state before each batch still on its way was drawn."""

    def examples(self, ctx: StepContext) -> list[Example]:
        """This step's examples, after asking for every batch the staleness bound allows now."""
        step, run = ctx.step, ctx.run
        self.issued_through = max(self.issued_through, step - 1)  # a resumed run starts at its step
        for k in steps_to_issue(step, self.issued_through, self.max_staleness, self.total_steps):
            self.loader_before[k] = run.loader.state_dict()
            examples = run.loader.next_batch()
            prompts = [run.encoder.encode(e) for e in examples]
            with ctx.timer("weight_sync"):
                self.fleet.sync(step)
            ticket = self.fleet.submit(prompts, ctx.sampling(), sampling_seed(ctx.config.trainer.seed, k, 0, 0))
            self.issued[k] = Issued(k, examples, prompts, ticket)
            self.issued_through = k
        if step not in self.issued:  # a step past the last (validation alone): nothing to train on
            return run.loader.next_batch()
        return self.issued[step].examples

    def take(self, step: int, examples: list[Example]) -> Issued | None:
        """The batch asked for `step`, when these are its examples (None otherwise: another draw)."""
        issued = self.issued.get(step)
        if issued is None or issued.examples is not examples:
            return None
        self.loader_before.pop(step, None)
        return self.issued.pop(step)

    def loader_state(self, step: int, current: dict[str, Any]) -> dict[str, Any]:
        """What a checkpoint taken before `step` records of the loader: where it stood before the first
        batch still on its way (`current` when none is)."""
        pending = sorted(k for k in self.loader_before if k >= step)
        return dict(self.loader_before[pending[0]]) if pending else current
