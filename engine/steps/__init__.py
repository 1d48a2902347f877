"""Step functions: one training step of a job, written against a StepContext, behind a registry."""

from . import dpo as _dpo  # noqa: F401  (registers the built-in steps)
from . import dynamic_sampling as _dynamic_sampling  # noqa: F401
from . import on_policy as _on_policy  # noqa: F401
from .batches import Advantaged, Batch, Forwarded
from .registry import STEPS, StepEntry, StepFn, register_step, step_entry

__all__ = ["Advantaged", "Batch", "Forwarded", "STEPS", "StepEntry", "StepFn", "register_step", "step_entry"]
