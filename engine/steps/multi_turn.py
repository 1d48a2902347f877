"""The context's generate for a multi-turn job: trajectories instead of one-turn completions.

`RolloutOps.generate` hands over to `generate_multi_turn` when the run has a multi-turn rollout
(rollout.multiTurn), so every step function and preset gets trajectories from the same call. A
trajectory is a completion whose tokens are MaskedTokens: `ctx.batch` packs it as one sequence (its
prompt shared with its group's other samples) whose mask keeps only the policy's tokens, which is
all the loss, the KL, the entropy and the advantages read. The rewards see the conversation
(runtime/multi_turn_run.py). Metrics: multi_turn/* below, and the rollout's usual ones.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..data import Example
from ..rollout.trajectory import Trajectory
from ..rollout.vllm_backend import Sampling
from .records import Rollout

if TYPE_CHECKING:
    from .rollout_ops import RolloutOps


def nearest_rank(values: list[float], share: float) -> float:
    """The `share` quantile by the nearest-rank rule: the smallest value with at least that share of
    the values at or below it (p90 of 10 values is the 9th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def tool_latency_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Mean and p90 wall seconds of the step's tool calls, as the environment timed them (the trainer's
    view: a sandbox's start, the call, its transfer); absent when no tool ran."""
    seconds = [s for t in trajectories for s in t.tool_seconds]
    if not seconds:
        return {}
    return {"multi_turn/tool_seconds_mean": sum(seconds) / len(seconds), "multi_turn/tool_seconds_p90": nearest_rank(seconds, 0.9)}


def multi_turn_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    n = max(1, len(trajectories))
    tokens = sum(len(t.token_ids) for t in trajectories)
    return {
        **tool_latency_metrics(trajectories),
        "multi_turn/turns_mean": sum(t.turns for t in trajectories) / n,
        "multi_turn/tool_calls": float(sum(t.tool_calls for t in trajectories)),
        "multi_turn/tool_errors": float(sum(t.tool_errors for t in trajectories)),
        "multi_turn/tool_timeouts": float(sum(t.tool_timeouts for t in trajectories)),
        "multi_turn/tool_calls_per_trajectory": sum(t.tool_calls for t in trajectories) / n,
        "multi_turn/policy_token_share": sum(t.policy_tokens for t in trajectories) / max(1, tokens),
    }


def generate_multi_turn(ctx: "RolloutOps", examples: list[Example], sampling: Sampling | None = None) -> Rollout:
    """Trajectories of every example (rollout.samplesPerPrompt each, or one greedy), on every replica for its share."""
    run = ctx.run
    ctx.switch_to_rollout()
    seed = ctx.draw_seed()
    started = ctx.timer.seconds.get("rollout", 0.0)
    with ctx.timer("rollout"):
        prompts, trajectories = run.multi_turn.generate(examples, sampling or ctx.sampling(), seed)
    seconds = ctx.timer.seconds["rollout"] - started
    ctx.record.add(multi_turn_metrics(trajectories))
    ctx.record.add(rollout_tokens_per_second=sum(t.policy_tokens for t in trajectories) / max(seconds, 1e-9))
    if run.multi_turn.prefix_cache_hit_ratio is not None:
        ctx.record.add(rollout_prefix_cache_hit_ratio=run.multi_turn.prefix_cache_hit_ratio)
    return Rollout(list(examples), prompts, trajectories)
