"""What this engine runs, checked before any rank joins another or any model loads."""

from __future__ import annotations

from pathlib import Path

from .. import algorithms as A
from ..config.topology import EngineConfig
from .algorithm_checks import ConfigError, check_algorithm
from .multi_turn_run import check_multi_turn
from .plugins import load_plugins

__all__ = ["ConfigError", "check_supported"]


def check_placement(config: EngineConfig) -> None:
    """rollout.placement: separate and algorithm.async: what the engine runs of them (after the plug-ins
    are loaded: a plug-in's step or estimator is held to the same)."""
    rollout, algorithm = config.rollout, config.algorithm
    separate = rollout is not None and rollout.placement == "separate"
    if algorithm.async_ is not None and not separate:
        raise ConfigError("algorithm.async: generation ahead of the update needs rollout.placement: separate and roles.rollout")
    if "rollout" in config.roles and not separate:
        raise ConfigError("roles.rollout: the role generates only with rollout.placement: separate; set it or remove the role")
    if not separate:
        return
    assert rollout is not None
    if "rollout" not in config.roles:
        raise ConfigError("roles.rollout: rollout.placement: separate needs the ranks that generate (roles.rollout)")
    if (
        config.roles["rollout"].colocated_with is not None
        or config.roles["rollout"].layout.world_size != config.roles["rollout"].ranks
        or (config.roles["rollout"].layout.tp, config.roles["rollout"].layout.pp) != (1, 1)
    ):
        raise ConfigError("roles.rollout.layout: one vLLM engine per rank of its own (tp 1, pp 1) is all that runs for now")
    if algorithm.async_ is not None and algorithm.async_.partial_rollout:
        raise ConfigError("algorithm.async.partialRollout: not supported yet; set it to false")
    refused = {
        "rollout.multiTurn": rollout.multi_turn is not None,
        "rollout.backend": rollout.backend != "vllm",
    }
    for field, present in refused.items():
        if present:
            raise ConfigError(f"{field}: not supported with rollout.placement: separate yet; use placement: colocated")
    choice = A.choice_of(algorithm)
    if choice.step != "on_policy":
        raise ConfigError(
            f"rollout.placement: separate runs the on_policy step only, for now, not {choice.step} "
            f"({algorithm.name}); use placement: colocated"
        )
    estimator = A.estimator_of(algorithm)
    if estimator is not None and estimator.needs_greedy:
        raise ConfigError(
            f"rollout.placement: separate does not run {estimator.name} yet (a greedy draw per step); use placement: colocated"
        )


def check_supported(config: EngineConfig) -> None:
    """Refuse what cannot run, with the field named. Loads the job's algorithm plug-ins first, so
    that their estimators, losses, steps and presets are known."""
    algorithm = config.algorithm
    load_plugins([Path(p.path).expanduser() for p in algorithm.plugins])
    samples = config.rollout.samples_per_prompt if config.rollout is not None else 1
    check_algorithm(algorithm, samples, algorithm.tis is not None)
    check_multi_turn(
        config.rollout.multi_turn if config.rollout is not None else None
    )  # after the plug-ins: they may register environments
    estimator = A.estimator_of(algorithm)
    if estimator is not None and estimator.needs_critic and "critic" not in config.roles:
        raise ConfigError(f"roles.critic: the advantage estimator {estimator.name} learns a critic; add roles.critic")
    for role, topo in config.roles.items():
        if role == "critic" and not (estimator is not None and estimator.needs_critic):
            raise ConfigError(f"roles.critic: {algorithm.name} has no critic; remove the role")
        if role == "ref" and not algorithm.needs_reference:
            raise ConfigError(
                f"roles.ref: {algorithm.name} uses no reference policy (klCoef is 0); remove the role or set algorithm.klCoef"
            )
        if role == "ref" and config.trainer.lora is not None and topo.colocated_with is None:
            raise ConfigError(
                "roles.ref: with trainer.lora the reference is the base model with the adapter off, on the "
                "actor's ranks; a reference on ranks of its own would be a second copy of the weights"
            )
        if role == "reward" and (config.reward is None or config.reward.model is None):
            raise ConfigError("roles.reward: the reward role runs a reward model, but reward.model is not set")
        if role == "reward" and topo.colocated_with is None and (topo.layout.tp, topo.layout.pp) != (1, 1):
            raise ConfigError(
                f"roles.reward.layout: a reward model runs data-parallel only (tp=1, pp=1), not tp={topo.layout.tp}, pp={topo.layout.pp}"
            )
    check_placement(config)
    actor = config.roles["actor"]
    if actor.layout.tp % actor.rollout_tp:
        raise ConfigError(f"roles.actor.layout.rolloutTp: {actor.rollout_tp} must divide the actor's tp={actor.layout.tp}")
    if config.algorithm.on_policy and config.reward is None:
        raise ConfigError("reward: a reward source is required for on-policy algorithms")
    from ..tracking import TrackingError, check_available

    try:
        check_available(config.tracking)
    except TrackingError as exc:
        raise ConfigError(str(exc)) from None
