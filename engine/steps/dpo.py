"""Direct preference optimisation's step: the data's preference pairs against the reference, no
rollout. The loss is the job's (the dpo preset's registered `dpo` loss over row pairs)."""

from __future__ import annotations

from .context import StepContext
from .registry import register_step


@register_step("dpo", on_policy=False, summary="DPO on the data's chosen/rejected pairs against the reference policy")
def dpo(ctx: StepContext) -> None:
    ctx.record.add(lr=ctx.learning_rate())
    pairs = ctx.pairs(ctx.next_prompts())  # for dpo the batch sizes count pairs: a micro-batch of k pairs holds 2k rows
    ctx.update(ctx.forward_roles(pairs))
