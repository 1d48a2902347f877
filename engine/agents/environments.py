"""Environments of multi-turn rollouts, behind a registry: what answers each of the policy's turns.

An environment is made fresh for every trajectory. `reset(example, messages)` starts it with the
example and the prompt's chat messages (and may change them); `step(text)` takes the policy's turn
and returns an `Observation`: the messages to append (tool results, a user's reply), a reward, and
whether the trajectory is done. Tool calling is one environment (tool_env.py); a plug-in file of
algorithm.plugins registers another with `@register_environment(name, summary=...)` on a factory
`factory(setup, **options) -> Environment`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..common.registry import Registry
from ..config.multi_turn import MultiTurnSpec
from ..data import Example
from .parsers import ParserEntry
from .tools import Tool


@dataclass(frozen=True)
class Observation:
    messages: list[dict[str, Any]] = field(default_factory=list)
    """Appended to the conversation and rendered by the chat template (masked out of the loss)."""
    reward: float = 0.0
    """Added to the trajectory's reward (the job's reward sources score the whole trajectory besides)."""
    done: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_seconds: tuple[float, ...] = ()
    """Wall seconds of each tool call the turn ran (multi_turn/tool_seconds_* of the step); a plug-in
    environment that calls tools may fill it too."""


class Environment:
    """One trajectory's environment. `step` may block (it runs tools); the steps of a turn's
    trajectories run concurrently, each on its own instance."""

    def reset(self, example: Example, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return messages

    def step(self, text: str) -> Observation:
        raise NotImplementedError


@dataclass(frozen=True)
class EnvironmentSetup:
    """What every environment of a run may use."""

    spec: MultiTurnSpec
    tools: dict[str, Tool]
    parser: ParserEntry


EnvironmentFactory = Callable[..., Environment]


@dataclass(frozen=True)
class EnvironmentEntry:
    name: str
    factory: EnvironmentFactory
    summary: str


ENVIRONMENTS: Registry[EnvironmentEntry] = Registry("environment")


def register_environment(name: str, *, summary: str) -> Callable[[EnvironmentFactory], EnvironmentFactory]:
    def register(factory: EnvironmentFactory) -> EnvironmentFactory:
        ENVIRONMENTS[name] = EnvironmentEntry(name, factory, summary)
        return factory

    return register


def environment_entry(name: str) -> EnvironmentEntry:
    return ENVIRONMENTS[name]
