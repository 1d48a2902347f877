"""Where rewards come from: rule functions by name, a user's Python file, or a reward model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import LocalPath, Rule, SpecModel, pattern
from .model import ModelSpec

# The engine's registry of rule rewards; the names are part of the API, so they live here.
RewardRuleName = Literal["math_answer", "format", "length_penalty"]


class RewardRule(SpecModel):
    """A rule function from kuberl's registry, with its arguments."""

    name: RewardRuleName
    """math_answer (the last number of the response equals the answer), format, length_penalty."""
    weight: float = Field(default=1.0, ge=-1000.0, le=1000.0)
    """Multiplies the rule's score; the reward is the weighted sum over rules. Within +-1000, as the
    rules score in about -1..1 and a larger weight would only rescale every advantage."""
    args: dict[str, Any] = {}
    """Keyword arguments of the rule function."""


class PythonReward(SpecModel):
    """A reward function in the user's own Python file."""

    path: LocalPath
    """The local .py file."""
    function: str = Field(
        default="reward", min_length=1, max_length=256, pattern=pattern(r"^[A-Za-z_][A-Za-z0-9_]*$", "a Python function name")
    )
    """The function's name; it is called as f(prompt, response, answer) -> float."""

    RULES = (
        Rule(
            message="path must name a .py file",
            check=lambda s: s.path.endswith(".py"),
            cel="self.path.endsWith('.py')",
            field="path",
        ),
    )


class RewardSpec(SpecModel):
    """The reward of each response: the sum of every source given."""

    rules: list[RewardRule] = Field(default=[], max_length=32)
    """Rule functions by name."""
    python: PythonReward | None = None
    """A function from a Python file."""
    model: ModelSpec | None = None
    """A reward model (sequence classifier); runs on roles.reward."""

    RULES = (
        Rule(
            message="give at least one reward source: rules, python or model",
            check=lambda s: bool(s.rules) or s.python is not None or s.model is not None,
            cel="self.rules.size() > 0 || has(self.python) || has(self.model)",
        ),
        Rule(
            message="each rule may appear once: to count a rule more, raise its weight",
            check=lambda s: len({r.name for r in s.rules}) == len(s.rules),
            cel="self.rules.all(r, self.rules.filter(x, x.name == r.name).size() == 1)",
            field="rules",
            detail=lambda s: "repeated: " + ", ".join(sorted({r.name for r in s.rules if sum(x.name == r.name for x in s.rules) > 1})),
        ),
    )
