"""The registries of advantage estimators and policy losses: names, functions and what each needs.

An entry's traits say what a job must have to run it (a critic, several samples per prompt), so
that a job that cannot run it is refused before any model loads, from one declaration. verl's
core_algos registers its estimators and losses the same way. An estimator takes an
`AdvantageInputs` record and a loss a `LossInputs` record (inputs.py), then its options: keyword
arguments with defaults, bounded where a value would not train (config/options.py's `Bound`).
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..common.registry import Registry
from ..config.options import Bound
from .inputs import AdvantageInputs, Advantages, LossInputs

__all__ = [
    "ADVANTAGES",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageInputs",
    "Advantages",
    "LossInputs",
    "PolicyLoss",
    "advantage_estimator",
    "policy_loss_entry",
    "register_advantage",
    "register_policy_loss",
]

LossResult = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class AdvantageEstimator:
    name: str
    fn: Callable[..., Advantages]
    summary: str
    needs_critic: bool = False
    min_samples: int = 1
    """Samples per prompt it needs (2 for a group baseline)."""
    needs_greedy: bool = False
    """It compares with a greedy response to each prompt, which the step then generates and scores (ReMax)."""
    needs_pi_squared: bool = False
    """It reads the old policy's sum of squared probabilities per token, which the step computes with
    one more forward of the actor (the optimal token baseline)."""
    group_options: dict[str, Any] = field(default_factory=dict)
    """Option values that make it compare samples of one prompt, so that they need at least 2
    (REINFORCE++'s baseline: True), though the estimator itself runs on one."""

    @property
    def options(self) -> dict[str, Any]:
        return _options(self.fn)

    @property
    def bounds(self) -> dict[str, Bound]:
        return _bounds(self.fn)


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    fn: Callable[..., LossResult]
    summary: str
    pairs: bool = False
    """It reads rows as (chosen, rejected) preference pairs (DPO); only presets that train on pairs take it."""
    corrects_rollout: bool = False
    """It weighs the rollout's tokens by importance weights of its own (the bypass mode), so algorithm.tis,
    which does the same, does not apply."""

    @property
    def options(self) -> dict[str, Any]:
        return _options(self.fn)

    @property
    def bounds(self) -> dict[str, Bound]:
        return _bounds(self.fn)


ADVANTAGES: Registry[AdvantageEstimator] = Registry("advantage estimator")
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def _options(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keyword options of `fn` after its one inputs argument, with their defaults."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return {p.name: p.default for p in params}


def _bounds(fn: Callable[..., Any]) -> dict[str, Bound]:
    """The options' bounds, declared as Annotated[type, Bound(...)] on the parameters; an option typed
    Literal[...] may take only those values."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # an annotation that does not resolve carries no bound
        return {}
    found = {}
    for name in _options(fn):
        hint = hints.get(name)
        for extra in getattr(hint, "__metadata__", ()):
            if isinstance(extra, Bound):
                found[name] = extra
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        if typing.get_origin(hint) is typing.Literal:
            found[name] = Bound(one_of=typing.get_args(hint))
    return found


def register_advantage(
    name: str,
    *,
    summary: str,
    needs_critic: bool = False,
    min_samples: int = 1,
    needs_greedy: bool = False,
    needs_pi_squared: bool = False,
    group_options: dict[str, Any] | None = None,
) -> Callable:
    def register(fn: Callable[..., Advantages]) -> Callable[..., Advantages]:
        ADVANTAGES[name] = AdvantageEstimator(
            name, fn, summary, needs_critic, min_samples, needs_greedy, needs_pi_squared, dict(group_options or {})
        )
        return fn

    return register


def register_policy_loss(name: str, *, summary: str, pairs: bool = False, corrects_rollout: bool = False) -> Callable:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        POLICY_LOSSES[name] = PolicyLoss(name, fn, summary, pairs, corrects_rollout)
        return fn

    return register


def advantage_estimator(name: str) -> AdvantageEstimator:
    return ADVANTAGES[name]


def policy_loss_entry(name: str) -> PolicyLoss:
    return POLICY_LOSSES[name]
