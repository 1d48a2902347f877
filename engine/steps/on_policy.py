"""The on-policy RL step every generating preset but dapo runs (the data flow of one step in docs/architecture.md)."""

from __future__ import annotations

from .context import StepContext
from .registry import register_step


@register_step("on_policy", summary="generate, score, reference/critic forward, advantages, update (PPO, GRPO, RLOO, REINFORCE++, ...)")
def on_policy(ctx: StepContext) -> None:
    examples = ctx.next_prompts()
    ctx.record.add(lr=ctx.learning_rate())
    rollout = ctx.generate(examples)
    greedy = None
    if ctx.run.estimator.needs_greedy:  # ReMax's baseline: one greedy response per prompt, scored alike
        greedy = ctx.score(ctx.generate(examples, ctx.sampling(greedy=True)), then_train=False)
    scores = ctx.score(rollout)
    ctx.record.add(reward_mean=float(scores.values.mean()))
    ctx.record.add({f"reward/{k}": v for k, v in scores.parts.items()})
    forwarded = ctx.forward_roles(ctx.batch(rollout))
    ctx.update(ctx.advantages(forwarded, rollout, scores, greedy))
