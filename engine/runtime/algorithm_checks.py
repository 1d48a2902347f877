"""What the engine refuses of a job's algorithm once its plug-ins are loaded: names, options and the
traits of the preset, estimator, loss and step that run, held to one another."""

from __future__ import annotations

from .. import algorithms as A
from ..algorithms.presets import AlgorithmChoice
from ..config.algorithm import AlgorithmSpec
from ..config.options import option_manifest_name
from ..config.termination import NotRetryable
from ..steps import STEPS


class ConfigError(NotRetryable, ValueError):
    """The job asks for something this engine cannot do; the message names the field."""

    reason = "InvalidConfig"


def _words(names: list[str]) -> str:
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


def _bounds(field: str, entry: A.AdvantageEstimator | A.PolicyLoss, options: dict) -> None:
    bounds = entry.bounds
    for name, value in options.items():
        problem = bounds[name].problem(value) if name in bounds else None
        if problem:
            raise ConfigError(f"algorithm.{field}.options.{option_manifest_name(name)}: {problem}")


def check_algorithm(algorithm: AlgorithmSpec, samples: int, tis: bool) -> AlgorithmChoice:
    """Refuse an algorithm this engine cannot run (its plug-ins loaded); returns what runs.
    `samples`: rollout.samplesPerPrompt (1 without a rollout); `tis`: algorithm.tis is set."""
    if algorithm.name not in A.PRESETS:
        raise ConfigError(f"algorithm.name: {algorithm.name!r} is not a registered preset (known: {', '.join(A.PRESETS)})")
    preset = A.preset_entry(algorithm.name)
    if algorithm.preset is None and (preset.pairs or preset.needs_reference or preset.options is not None):
        raise ConfigError(
            f"algorithm.name: the plug-in preset {preset.name} trains on pairs, needs a reference or has a block "
            "of options; a plug-in preset must do without (the API cannot hold a job to its traits)"
        )
    choice = A.choice_of(algorithm)
    for field, name, entries in (
        ("advantage", choice.advantage, A.ADVANTAGES),
        ("policyLoss", choice.policy_loss, A.POLICY_LOSSES),
        ("step", choice.step, STEPS),
    ):
        if name and name not in entries:
            raise ConfigError(f"algorithm.{field}.name: {name!r} is not registered (known: {', '.join(sorted(entries))})")
    pair_presets = [p.name for p in A.PRESETS.values() if p.pairs]
    step = STEPS[choice.step]
    if step.on_policy == preset.pairs:
        raise ConfigError(
            f"algorithm.step.name: {step.name} "
            + (
                f"trains on preference pairs: it is {_words(pair_presets)}'s step"
                if not step.on_policy
                else f"generates and scores; {preset.name} trains on given pairs"
            )
        )
    loss = A.policy_loss_entry(choice.policy_loss)
    if loss.pairs != preset.pairs:
        raise ConfigError(
            f"algorithm.policyLoss.name: {loss.name} "
            + (
                f"reads preference pairs: it is for {_words(pair_presets)}"
                if loss.pairs
                else f"does not read preference pairs, which {preset.name} trains on"
            )
        )
    if tis and loss.corrects_rollout:
        raise ConfigError(f"algorithm.tis: {loss.name} corrects the rollout's tokens with weights of its own; remove tis")
    _bounds("policyLoss", loss, choice.policy_loss_options)
    estimator = A.estimator_of(algorithm)
    if estimator is not None:
        _bounds("advantage", estimator, choice.advantage_options)
        if samples < estimator.min_samples:
            raise ConfigError(
                f"rollout.samplesPerPrompt: {algorithm.name} ({estimator.name}) needs at least {estimator.min_samples} samples per prompt"
            )
        asked = [k for k, v in estimator.group_options.items() if choice.advantage_options.get(k) == v]
        if asked and samples < 2:
            raise ConfigError(
                f"rollout.samplesPerPrompt: {estimator.name}'s {option_manifest_name(asked[0])} compares a prompt's "
                "samples; with one sample per prompt there is nothing to compare"
            )
    if choice.step == "dynamic_sampling" and samples < 2:
        raise ConfigError(
            "rollout.samplesPerPrompt: dynamic sampling keeps groups whose samples' rewards differ; it needs at least 2 samples per prompt"
        )
    return choice
