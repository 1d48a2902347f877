"""The registries of advantage estimators and policy losses: names, functions and what each needs.

An entry's traits say what a job must have to run it (a critic, several samples per prompt), so
that a job that cannot run it is refused before any model loads, from one declaration. verl's
core_algos registers its estimators and losses the same way.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator sees of one step: [B] per response, [B, T] per token."""

    scores: torch.Tensor
    """The reward of each response."""
    group: torch.Tensor
    """Responses of the same prompt share a group id."""
    mask: torch.Tensor
    """1 on response tokens."""
    values: torch.Tensor | None = None
    """The critic's values of the response tokens (estimators that need a critic)."""
    kl_penalty: torch.Tensor | None = None
    """klCoef * KL per token when the KL is in the reward (klInReward); subtracted from token rewards."""
    greedy_scores: torch.Tensor | None = None
    """[B] the reward of a greedy response to each response's prompt (estimators with needs_greedy)."""


@dataclass(frozen=True)
class Advantages:
    advantages: torch.Tensor
    """[B, T], 0 outside the mask."""
    returns: torch.Tensor | None = None
    """[B, T] value targets for the critic, from estimators that use one."""


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

    @property
    def options(self) -> dict[str, Any]:
        return _options(self.fn, skip=1)


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    summary: str

    @property
    def options(self) -> dict[str, Any]:
        return _options(self.fn, skip=4)


ADVANTAGES: dict[str, AdvantageEstimator] = {}
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def _options(fn: Callable[..., Any], skip: int) -> dict[str, Any]:
    """The keyword options of `fn` after its `skip` data arguments, with their defaults."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return {p.name: p.default for p in params}


def register_advantage(name: str, *, summary: str, needs_critic: bool = False, min_samples: int = 1,
                       needs_greedy: bool = False) -> Callable:
    def register(fn: Callable[..., Advantages]) -> Callable[..., Advantages]:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ADVANTAGES[name] = AdvantageEstimator(name, fn, summary, needs_critic, min_samples, needs_greedy)
        return fn

    return register


def register_policy_loss(name: str, *, summary: str) -> Callable:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = PolicyLoss(name, fn, summary)
        return fn

    return register


def advantage_estimator(name: str) -> AdvantageEstimator:
    if name not in ADVANTAGES:
        raise KeyError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ADVANTAGES))}")
    return ADVANTAGES[name]


def policy_loss_entry(name: str) -> PolicyLoss:
    if name not in POLICY_LOSSES:
        raise KeyError(f"unknown policy loss {name!r}; known: {', '.join(sorted(POLICY_LOSSES))}")
    return POLICY_LOSSES[name]
