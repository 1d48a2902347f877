"""The registry of presets: what `algorithm.name` selects, registered in the file that defines it.

A preset names a registered advantage estimator, policy loss and step function, says how the
algorithm section (and the preset's own block of options) becomes their options, and states its
traits: whether it trains on preference pairs (no rollout, no reward) and whether it always needs a
reference policy. Whether it needs a critic or several samples per prompt follows from its
estimator. The API's preset names, blocks and rules are generated from this registry into the
torch-free catalog (engine/runtime/catalog.py), as the estimators' and losses' are.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ...common.registry import Registry
from ...config.options import option_python_name
from ..registry import AdvantageEstimator, advantage_estimator

OptionsFn = Callable[[Any, Any], dict[str, Any]]
"""(the algorithm section, the preset's block or None) -> keyword options by their Python names."""


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    advantage: str | None
    """A registered estimator; None for a preset that trains on pairs (no advantages)."""
    policy_loss: str
    step: str = "on_policy"
    options: type | None = None
    """The preset's block of options (a SpecModel class): `algorithm.<name>` in a manifest."""
    advantage_options: OptionsFn | None = None
    """The estimator's options; default: the block's fields that are options of the estimator."""
    policy_loss_options: OptionsFn | None = None
    """The loss's options; default: none (the loss's own defaults)."""
    pairs: bool = False
    """It trains on preference pairs of the data: no rollout, no reward, data.chosenField/rejectedField."""
    needs_reference: bool = False
    """It needs the reference policy whatever klCoef is (its loss compares with it)."""
    module: str = ""
    """The module that registered it (a built-in's is under kuberl.engine.algorithms)."""


PRESETS: Registry[Preset] = Registry("preset")


def register_preset(
    name: str,
    *,
    summary: str,
    advantage: str | None,
    policy_loss: str,
    step: str = "on_policy",
    options: type | None = None,
    advantage_options: OptionsFn | None = None,
    policy_loss_options: OptionsFn | None = None,
    pairs: bool = False,
    needs_reference: bool = False,
) -> Preset:
    """Register a preset (in the file that defines it); returns its record."""
    module = sys._getframe(1).f_globals.get("__name__", "")
    preset = Preset(
        name, summary, advantage, policy_loss, step, options, advantage_options, policy_loss_options, pairs, needs_reference, module
    )
    PRESETS[name] = preset
    return preset


def preset_entry(name: str) -> Preset:
    return PRESETS[name]


def clip_options(spec: Any, block: Any = None) -> dict[str, Any]:
    """PPO's clip options from the algorithm section: clipRatio, clipRatioHigh, lossAggregation."""
    return {"clip_low": spec.clip_ratio, "clip_high": spec.clip_ratio_high, "aggregation": spec.loss_aggregation}


@dataclass(frozen=True)
class AlgorithmChoice:
    advantage: str
    """A name in ADVANTAGES; empty for a preset that trains on pairs, which has no advantages."""
    advantage_options: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "ppo_clip"
    """A name in POLICY_LOSSES."""
    policy_loss_options: dict[str, Any] = field(default_factory=dict)
    step: str = "on_policy"
    """A name in engine.steps' registry: the function that runs one step."""


def _block_options(block: Any, estimator: str) -> dict[str, Any]:
    """The block's fields that are options of the estimator, by their Python names."""
    if block is None:
        return {}
    known = advantage_estimator(estimator).options
    return {k: getattr(block, k) for k in type(block).model_fields if k in known}


def choice_of(spec: Any) -> AlgorithmChoice:
    """The registry entries and options that run: the preset's, with `advantage`, `policyLoss` and
    `step` in their place when set."""
    preset = preset_entry(spec.name)
    block = spec.block(spec.name)
    advantage_options: dict[str, Any] = {}
    if preset.advantage:
        advantage_options = preset.advantage_options(spec, block) if preset.advantage_options else _block_options(block, preset.advantage)
    loss_options = preset.policy_loss_options(spec, block) if preset.policy_loss_options else {}
    choice = AlgorithmChoice(preset.advantage or "", advantage_options, preset.policy_loss, loss_options, preset.step)
    if spec.advantage is not None:
        choice = replace(choice, advantage=spec.advantage.name, advantage_options=_kwargs(spec.advantage.options))
    if spec.policy_loss is not None:
        choice = replace(choice, policy_loss=spec.policy_loss.name, policy_loss_options=_kwargs(spec.policy_loss.options))
    if spec.step is not None:
        choice = replace(choice, step=spec.step.name)
    return choice


def estimator_of(spec: Any) -> AdvantageEstimator | None:
    """The registered estimator that runs (None for a preset without advantages); a plug-in's once its file is loaded."""
    name = choice_of(spec).advantage
    return advantage_estimator(name) if name else None


def _kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """Manifest option names (camelCase) as the functions' keyword arguments."""
    return {option_python_name(k): v for k, v in options.items()}
