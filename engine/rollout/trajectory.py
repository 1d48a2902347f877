"""A multi-turn trajectory: one completion whose tokens are the policy's turns and, between them,
what the environment answered, with the mask of the policy's own tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..agents import Environment, Observation
from ..training.sequences import MaskedTokens
from .vllm_backend import Completion


@dataclass(frozen=True)
class Trajectory(Completion):
    """token_ids are MaskedTokens (1 on the policy's tokens); logprobs are vLLM's on the policy's
    tokens and 0 elsewhere; finished_by_stop is its last turn's."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    """The whole conversation: the prompt's messages, each turn of the policy, each observation."""
    response: str = ""
    """The policy's last turn as text: what reward functions read as the response."""
    env_reward: float = 0.0
    """The sum of the environment's rewards over the turns."""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_seconds: tuple[float, ...] = ()
    """Wall seconds of each tool call its environment ran, in order."""

    @property
    def policy_tokens(self) -> int:
        return sum(getattr(self.token_ids, "mask", [1] * len(self.token_ids)))


class Builder:
    """A trajectory being generated: tokens so far, its environment, and whether it goes on."""

    def __init__(self, prompt_index: int, messages: list[dict[str, Any]], env: Environment | None):
        self.prompt_index, self.messages, self.env = prompt_index, list(messages), env
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.finished_by_stop = False
        self.last_text = ""
        self.last_stop: int | None = None
        self.reward = 0.0
        self.turns = self.calls = self.errors = self.timeouts = 0
        self.tool_seconds: list[float] = []

    def add_turn(self, completion: Completion, text: str, stop_ids: tuple[int, ...]) -> None:
        ids = list(completion.token_ids)
        self.tokens += ids
        self.mask += [1] * len(ids)
        self.logprobs += list(completion.logprobs)
        self.finished_by_stop = completion.finished_by_stop
        self.last_stop = ids[-1] if ids and ids[-1] in stop_ids else None
        self.last_text = text
        self.messages.append({"role": "assistant", "content": text})
        self.turns += 1

    def add_observation(self, observation: Observation) -> None:
        """Its reward and counts (whether or not its messages make it into the trajectory)."""
        self.reward += observation.reward
        self.calls += observation.tool_calls
        self.errors += observation.tool_errors
        self.timeouts += observation.tool_timeouts
        self.tool_seconds += observation.tool_seconds

    def add_tokens(self, ids: list[int], messages: list[dict[str, Any]]) -> None:
        """The environment's answer: in the sequence (the policy reads it), out of the loss."""
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.messages += messages

    def build(self) -> Trajectory:
        return Trajectory(
            self.prompt_index,
            MaskedTokens(self.tokens, self.mask),
            self.logprobs,
            self.finished_by_stop,
            messages=self.messages,
            response=self.last_text,
            env_reward=self.reward,
            turns=self.turns,
            tool_calls=self.calls,
            tool_errors=self.errors,
            tool_timeouts=self.timeouts,
            tool_seconds=tuple(self.tool_seconds),
        )
