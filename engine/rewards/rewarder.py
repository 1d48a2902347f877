"""Rewards of a job: rule functions by name, a user's Python function, summed with weights.

A reward function is `f(prompt: str, response: str, answer: str | None, **args) -> float`; in a
multi-turn job one that also takes `messages` gets the whole conversation (older functions keep working). Rules
are pure; they run on the controller rank, which owns the decoded text of every response.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..common.user_code import import_user_file
from ..config.reward import RewardSpec
from ..config.termination import NotRetryable
from .rules import RULES, RewardFn


class RewardError(NotRetryable, ValueError):
    """A reward source that cannot be built or called; the message names the field."""

    reason = "RewardFailed"


def _check_args(field: str, fn: RewardFn, args: dict[str, Any]) -> None:
    params = inspect.signature(fn).parameters
    allowed = [name for name in params if name not in ("prompt", "response", "answer", "messages")]
    for key in args:
        if key not in allowed:
            raise RewardError(f"{field}.args: {key!r} is not an argument of this rule (allowed: {', '.join(allowed) or 'none'})")


def takes_messages(fn: RewardFn) -> bool:
    """Whether a reward function takes the conversation (a `messages` argument, or **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "messages" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def load_python_reward(path: Path, function: str) -> RewardFn:
    """The function `function` of the Python file `path`."""
    module = import_user_file(path, "reward.python.path", RewardError, kind="reward")
    fn = getattr(module, function, None)
    if not callable(fn):
        raise RewardError(f"reward.python.function: {path} has no function {function!r}")
    return fn


class RewardModel:
    """A sequence classifier with one output (a Hugging Face folder, GGUF or hub id): the score of
    the prompt as the policy saw it (chat template applied) followed by the response.

    It runs with transformers: on the controller when the reward role is colocated, else on the
    reward role's own ranks (each scores its share of the batch)."""

    def __init__(self, spec, base_dir: Path, batch_size: int = 16):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from ..models.resolve import model_folder

        folder = model_folder(spec, base_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        from ..common.dtypes import TORCH_DTYPES

        # auto is float32: the reward model scores on the CPU (nothing here places it on a GPU yet).
        dtype = TORCH_DTYPES.get(spec.dtype, torch.float32)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=dtype).eval()
        if self.model.config.num_labels != 1:
            raise RewardError(f"reward.model: {folder} has {self.model.config.num_labels} output labels; a reward model has 1")
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size

    def score_batch(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        import torch

        out: list[float] = []
        texts = [p + r for p, r in zip(prompts, responses)]
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start : start + self.batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out += self.model(**enc).logits[:, 0].float().tolist()
        return out

    def __call__(self, prompt: str, response: str, answer: str | None) -> float:
        return self.score_batch([prompt], [response])[0]


@dataclass(frozen=True)
class WeightedReward:
    name: str
    weight: float
    fn: RewardFn
    args: dict[str, Any]


class Rewarder:
    """The weighted sum of every configured reward source."""

    def __init__(self, spec: RewardSpec, base_dir: Path = Path("."), remote_model: Any = None):
        """`remote_model`: the reward model when it runs on ranks of its own (anything with score_batch)."""
        parts: list[WeightedReward] = []
        for index, rule in enumerate(spec.rules):
            fn = RULES[rule.name]
            _check_args(f"reward.rules[{index}]", fn, rule.args)
            parts.append(WeightedReward(rule.name, rule.weight, fn, dict(rule.args)))
        if spec.python is not None:
            path = Path(spec.python.path).expanduser()
            path = path if path.is_absolute() else base_dir / path
            parts.append(WeightedReward(f"python:{spec.python.function}", 1.0, load_python_reward(path, spec.python.function), {}))
        if spec.model is not None:
            parts.append(WeightedReward("model", 1.0, remote_model or RewardModel(spec.model, base_dir), {}))
        self.parts = parts

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        answers: Sequence[str | None],
        messages: Sequence[list[dict[str, Any]]] | None = None,
    ) -> tuple[list[float], dict[str, float]]:
        """Per-response rewards and the mean of each source (for metrics)."""
        detailed = self.score_sources(prompts, responses, answers, messages)
        return detailed.totals, detailed.means

    def score_sources(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        answers: Sequence[str | None],
        messages: Sequence[list[dict[str, Any]]] | None = None,
    ) -> "SourceScores":
        """Per-response rewards, and each source's own rewards and weight (GDPO normalises each source apart).

        `messages`: multi-turn rollouts' whole conversations (prompt, the policy's turns, tool
        results), given to each function that takes a `messages` argument; `responses` are then the
        policy's last turns."""
        totals = [0.0] * len(responses)
        by_source: dict[str, list[float]] = {}
        for part in self.parts:
            if hasattr(part.fn, "score_batch"):  # a reward model scores the whole batch at once
                values = list(part.fn.score_batch(prompts, responses))
            else:
                values = []
                extra = messages is not None and takes_messages(part.fn)
                for i, (prompt, response, answer) in enumerate(zip(prompts, responses, answers)):
                    try:
                        more = {"messages": messages[i]} if extra and messages is not None else {}
                        value = float(part.fn(prompt, response, answer, **part.args, **more))
                    except RewardError:
                        raise
                    except Exception as exc:
                        raise RewardError(f"reward {part.name} failed on response {i}: {type(exc).__name__}: {exc}") from exc
                    if not math.isfinite(value):
                        raise RewardError(f"reward {part.name} returned {value} on response {i}: rewards must be finite")
                    values.append(value)
            for i, value in enumerate(values):
                totals[i] += part.weight * value
            by_source[part.name] = values
        return SourceScores(totals, by_source, {part.name: part.weight for part in self.parts})


@dataclass(frozen=True)
class SourceScores:
    totals: list[float]
    """The weighted sum of every source, per response."""
    sources: dict[str, list[float]]
    """Each source's own reward of every response."""
    weights: dict[str, float]

    @property
    def means(self) -> dict[str, float]:
        return {name: sum(values) / max(1, len(values)) for name, values in self.sources.items()}
