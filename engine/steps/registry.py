"""The registry of step functions: what one training step of a job does, by name.

A step function takes a `StepContext` (context.py) and drives it: draw prompts, generate, score,
ask the reference and the critic, compute advantages, update. The built-ins are on_policy (every
on-policy preset), dynamic_sampling (DAPO) and dpo; a plug-in file registers its own with
`@register_step(name, summary=...)` and a job names it in algorithm.step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..common.registry import Registry

if TYPE_CHECKING:
    from .context import StepContext

StepFn = Callable[["StepContext"], None]


@dataclass(frozen=True)
class StepEntry:
    name: str
    fn: StepFn
    summary: str
    on_policy: bool = True
    """It generates with vLLM and scores with the job's reward (dpo trains on given pairs)."""


STEPS: Registry[StepEntry] = Registry("step function")


def register_step(name: str, *, summary: str, on_policy: bool = True) -> Callable[[StepFn], StepFn]:
    def register(fn: StepFn) -> StepFn:
        STEPS[name] = StepEntry(name, fn, summary, on_policy)
        return fn

    return register


def step_entry(name: str) -> StepEntry:
    return STEPS[name]
