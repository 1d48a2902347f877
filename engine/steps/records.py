"""The typed records a step passes around: a rollout, its scores, and the step's record."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..data import Example
from ..rollout.vllm_backend import Completion


@dataclass(frozen=True)
class Rollout:
    """Prompts and their completions, in prompt order; completion.prompt_index points into `examples`."""

    examples: list[Example]
    prompts: list[list[int]]
    """The token ids of each example's prompt."""
    completions: list[Completion]

    @property
    def group(self) -> torch.Tensor:
        """[B] the prompt index of each completion: samples of one prompt share it."""
        return torch.tensor([c.prompt_index for c in self.completions], dtype=torch.long)

    @property
    def tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)

    def groups(self, prompt_indices: list[int]) -> "Rollout":
        """Only the completions of these prompts, renumbered in the given order."""
        new_index = {old: new for new, old in enumerate(prompt_indices)}
        return Rollout(
            [self.examples[i] for i in prompt_indices],
            [self.prompts[i] for i in prompt_indices],
            [replace(c, prompt_index=new_index[c.prompt_index]) for c in self.completions if c.prompt_index in new_index],
        )

    def __add__(self, other: "Rollout") -> "Rollout":
        offset = len(self.examples)
        shifted = [replace(c, prompt_index=c.prompt_index + offset) for c in other.completions]
        return Rollout(self.examples + other.examples, self.prompts + other.prompts, self.completions + shifted)


@dataclass(frozen=True)
class Scores:
    """The reward of each completion of a rollout, and each reward source's mean (for metrics)."""

    values: torch.Tensor
    """[B] float32, in completion order."""
    parts: dict[str, float] = field(default_factory=dict)
    sources: dict[str, torch.Tensor] = field(default_factory=dict)
    """[B] each reward source's own reward of every completion (GDPO normalises each apart)."""
    weights: dict[str, float] = field(default_factory=dict)
    """Each source's weight in `values`."""

    def select(self, rows: list[int]) -> "Scores":
        return Scores(self.values[rows], self.parts, {k: v[rows] for k, v in self.sources.items()}, self.weights)

    def __add__(self, other: "Scores") -> "Scores":
        n, m = len(self.values), len(other.values)
        parts = {k: (self.parts.get(k, 0.0) * n + other.parts.get(k, 0.0) * m) / max(1, n + m) for k in {*self.parts, *other.parts}}
        sources = {k: torch.cat([self.sources[k], other.sources[k]]) for k in self.sources if k in other.sources}
        return Scores(torch.cat([self.values, other.values]), parts, sources, {**self.weights, **other.weights})


@dataclass
class StepRecord:
    """What one step reports: scalar metrics by name (metrics.jsonl, Prometheus, the progress
    report); the loop adds the step number, phase times and the checkpoint."""

    metrics: dict[str, float] = field(default_factory=dict)

    def add(self, values: dict[str, float] | None = None, /, **more: float) -> None:
        self.metrics.update(values or {}, **more)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.metrics)
