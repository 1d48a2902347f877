"""What a step function may use of the run it steps: the one RLRun of this rank (runtime/rl.py).

Named here as a Protocol so that the steps depend on what they use, not on the runner that calls
them: runtime/rl.py imports the step registry to run a job's step, and nothing here imports rl.py.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..algorithms.registry import AdvantageEstimator
from ..config.topology import EngineConfig
from ..data import PromptEncoder, PromptLoader
from ..rollout.generation import Generator
from ..rollout.multi_turn import MultiTurnRollout
from ..training.policy import LossFn, MegatronLM
from ..distributed.role_access import RoleAccess
from ..distributed.rollout_fleet import RolloutFleet
from ..rollout.switch import HybridSwitch
from .async_rollout import GenerationPipeline
from .records import Rollout, Scores


class StepRun(Protocol):
    config: EngineConfig
    step: int
    """The index of the running step (0 for the first)."""
    updates: int
    """Optimizer updates so far (the learning-rate schedule's position)."""
    dp_rank: int
    dp_size: int
    tokenizer: Any
    """The job's Hugging Face tokenizer."""
    pad_id: int
    encoder: PromptEncoder
    loader: PromptLoader
    actor: MegatronLM
    ref: MegatronLM | None
    """The colocated reference (None when it has ranks of its own, or the job has none)."""
    critic: MegatronLM | None
    needs_ref: bool
    needs_critic: bool
    roles: RoleAccess
    generator: Generator | None
    """vLLM on this rank's replica; None for a job that generates nothing (dpo)."""
    switch: HybridSwitch | None
    multi_turn: MultiTurnRollout | None
    """A multi-turn job's rollout loop (rollout.multiTurn); None otherwise."""
    fleet: RolloutFleet | None
    """rollout.placement: separate: the line to roles.rollout (generator and switch are then None)."""
    pipeline: GenerationPipeline | None
    """rollout.placement: separate: the batches asked of the fleet, up to maxStaleness steps ahead."""
    estimator: AdvantageEstimator | None
    """The registered estimator that runs (None for a preset that trains on pairs)."""
    policy_loss: LossFn
    """The job's loss: its registered policy loss and the KL and entropy terms (training/losses.py)."""
    value_loss: LossFn
    recompute_old_logprobs: bool

    def score(self, rollout: Rollout) -> Scores: ...

    def stop_ids(self) -> tuple[int, ...]: ...

    def total_updates(self) -> int: ...
