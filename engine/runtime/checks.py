"""What this engine runs, checked before any rank joins another or any model loads."""

from __future__ import annotations

from pathlib import Path

from .. import algorithms as A
from ..config.topology import EngineConfig


class ConfigError(ValueError):
    """The job asks for something this engine cannot do; the message names the field."""


def check_supported(config: EngineConfig) -> None:
    """Refuse what cannot run, with the field named. Loads the job's algorithm plug-ins first, so
    that their estimators, losses and steps are known."""
    from ..algorithms.plugins import load_plugins
    from ..steps import STEPS

    algorithm = config.algorithm
    load_plugins([Path(p.path).expanduser() for p in algorithm.plugins])
    choice = A.choice_of(algorithm)
    for field, name, entries in (("advantage", choice.advantage, A.ADVANTAGES), ("policyLoss", choice.policy_loss, A.POLICY_LOSSES),
                                 ("step", choice.step, STEPS)):
        if name and name not in entries:
            raise ConfigError(f"algorithm.{field}.name: {name!r} is not registered (known: {', '.join(sorted(entries))})")
    step = STEPS[choice.step]
    if step.on_policy != algorithm.on_policy:
        raise ConfigError(f"algorithm.step.name: {step.name} " + ("trains on preference pairs: it is dpo's step" if not step.on_policy
                                                                   else "generates and scores; dpo trains on given pairs"))
    estimator = A.estimator_of(algorithm)
    if estimator is not None and estimator.needs_critic and "critic" not in config.roles:
        raise ConfigError(f"roles.critic: the advantage estimator {estimator.name} learns a critic; add roles.critic")
    for role, topo in config.roles.items():
        if role == "critic" and not (estimator is not None and estimator.needs_critic):
            raise ConfigError(f"roles.critic: {algorithm.name} has no critic; remove the role")
        if role == "ref" and not algorithm.needs_reference:
            raise ConfigError(f"roles.ref: {algorithm.name} uses no reference policy (klCoef is 0); remove the role or set algorithm.klCoef")
        if role == "reward" and (config.reward is None or config.reward.model is None):
            raise ConfigError("roles.reward: the reward role runs a reward model, but reward.model is not set")
        if role == "reward" and topo.colocated_with is None and (topo.layout.tp, topo.layout.pp) != (1, 1):
            raise ConfigError(f"roles.reward.layout: a reward model runs data-parallel only (tp=1, pp=1), not "
                              f"tp={topo.layout.tp}, pp={topo.layout.pp}")
    actor = config.roles["actor"]
    if actor.layout.tp % actor.rollout_tp:
        raise ConfigError(f"roles.actor.layout.rolloutTp: {actor.rollout_tp} must divide the actor's tp={actor.layout.tp}")
    samples = config.rollout.samples_per_prompt if config.rollout is not None else 1
    if estimator is not None and samples < estimator.min_samples:
        raise ConfigError(f"rollout.samplesPerPrompt: {config.algorithm.name} ({estimator.name}) needs at least "
                          f"{estimator.min_samples} samples per prompt")
    if choice.step == "dynamic_sampling" and samples < 2:
        raise ConfigError("rollout.samplesPerPrompt: dynamic sampling keeps groups whose samples' rewards differ; "
                          "it needs at least 2 samples per prompt")
    if config.algorithm.on_policy and config.reward is None:
        raise ConfigError("reward: a reward source is required for on-policy algorithms")
    from ..tracking import TrackingError, check_available

    try:
        check_available(config.tracking)
    except TrackingError as exc:
        raise ConfigError(str(exc)) from None
