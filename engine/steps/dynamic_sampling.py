"""DAPO's step: dynamic sampling and overlong reward shaping around the on-policy step.

Groups whose samples all got the same reward have advantage 0 under a group baseline: they cost
a whole forward and backward and teach nothing. This step drops them and draws more prompts until
the step has trainer.promptsPerStep informative groups, or algorithm.dapo.maxDraws batches were
drawn (then it trains on what it has; with none, it skips the update and says so).
"""

from __future__ import annotations

import torch

from ..algorithms.shaping import informative_groups, overlong_penalty
from .context import StepContext
from .records import Rollout, Scores
from .registry import register_step


@register_step("dynamic_sampling", summary="DAPO: keep only groups whose rewards differ, drawing more prompts to fill the step")
def dynamic_sampling(ctx: StepContext) -> None:
    spec = ctx.config.algorithm.block("dapo")  # the dapo preset's block: its own, or its defaults
    max_new = ctx.config.rollout.max_response_tokens  # a multi-turn trajectory: its whole budget
    buffer = spec.overlong_buffer if spec.overlong_buffer is not None else max_new // 5
    wanted = ctx.config.trainer.prompts_per_step
    ctx.record.add(lr=ctx.learning_rate())

    kept: Rollout | None = None
    kept_scores: Scores | None = None
    drawn = draws = 0
    seen_rewards = []
    while draws < spec.max_draws and (kept is None or len(kept.examples) < wanted):
        rollout = ctx.generate(ctx.next_prompts())
        raw = ctx.score(rollout, then_train=False)
        lengths = torch.tensor([len(c.token_ids) for c in rollout.completions])
        penalty = overlong_penalty(lengths, max_new, buffer, spec.overlong_penalty)
        shaped = Scores(
            raw.values + penalty,
            {**raw.parts, "overlong_penalty": float(penalty.mean())},
            {**raw.sources, "overlong_penalty": penalty},
            {**raw.weights, "overlong_penalty": 1.0},
        )
        seen_rewards.append(raw.values)
        draws += 1
        drawn += len(rollout.examples)
        keep = informative_groups(shaped.values, rollout.group)[: wanted - (len(kept.examples) if kept else 0)]
        part = rollout.groups(keep)
        kept_ids = set(keep)
        rows = [i for i, c in enumerate(rollout.completions) if c.prompt_index in kept_ids]  # part's order
        part_scores = shaped.select(rows)
        kept, kept_scores = (part, part_scores) if kept is None else (kept + part, kept_scores + part_scores)
    ctx.to_training()

    ctx.record.add(
        {
            "reward_mean": float(torch.cat(seen_rewards).mean()),
            "dynamic_sampling/draws": float(draws),
            "dynamic_sampling/prompts_drawn": float(drawn),
            "dynamic_sampling/groups_kept": float(len(kept.examples)),
        }
    )
    ctx.record.add({f"reward/{k}": v for k, v in kept_scores.parts.items()})
    if not kept.completions:
        ctx.record.add(update_skipped=1.0)  # every group was uninformative: nothing to learn from
        return
    forwarded = ctx.forward_roles(ctx.batch(kept))
    ctx.update(ctx.advantages(forwarded, kept, kept_scores))
