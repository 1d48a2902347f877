"""The presets of `algorithm.name`, one file each (registry.py: what a preset is and `choice_of`).

A new preset is one more file here that calls `register_preset`, imported below; then regenerate
the catalog, the CRD and the docs (docs/tutorials/new-algorithm.md).
"""

from . import ppo, grpo, rloo, reinforce_pp, dpo, dapo, gspo, cispo, dr_grpo  # noqa: F401  (registers the presets, in this order)
from .registry import PRESETS, AlgorithmChoice, Preset, choice_of, clip_options, estimator_of, preset_entry, register_preset

__all__ = ["PRESETS", "AlgorithmChoice", "Preset", "choice_of", "clip_options", "estimator_of", "preset_entry", "register_preset"]
