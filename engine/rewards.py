"""Rewards: rule functions by name, a user's Python function, summed with weights.

A reward function is `f(prompt: str, response: str, answer: str | None, **args) -> float`. Rules
are pure; they run on the controller rank, which owns the decoded text of every response.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .config.reward import RewardSpec
from .user_code import import_user_file

RewardFn = Callable[..., float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in `text` ("12 + 7 = 19" -> 19.0), commas as thousands separators."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def math_answer(prompt: str, response: str, answer: str | None, tolerance: float = 1e-6) -> float:
    """1 when the last number of the response equals the reference answer, else 0.

    The last number, not the first: models tend to restate the question ("12 + 7 = 19").
    """
    if answer is None:
        raise ValueError("math_answer needs a reference answer: set data.answerField")
    expected = last_number(str(answer))
    got = last_number(response)
    if expected is None or got is None:
        return 0.0
    return 1.0 if math.isclose(got, expected, rel_tol=0.0, abs_tol=tolerance) else 0.0


def format_match(prompt: str, response: str, answer: str | None, pattern: str = r"\s*-?\d+(\.\d+)?\s*") -> float:
    """1 when the whole response matches `pattern` (default: a number and nothing else), else 0."""
    return 1.0 if re.fullmatch(pattern, response, flags=re.DOTALL) else 0.0


def length_penalty(prompt: str, response: str, answer: str | None, max_chars: int = 256) -> float:
    """0 up to max_chars characters, then minus the excess as a share of max_chars."""
    return -max(0, len(response) - max_chars) / max_chars


RULES: dict[str, RewardFn] = {"math_answer": math_answer, "format": format_match, "length_penalty": length_penalty}


class RewardError(ValueError):
    """A reward source that cannot be built or called; the message names the field."""


def _check_args(field: str, fn: RewardFn, args: dict[str, Any]) -> None:
    params = inspect.signature(fn).parameters
    allowed = [name for name in params if name not in ("prompt", "response", "answer")]
    for key in args:
        if key not in allowed:
            raise RewardError(f"{field}.args: {key!r} is not an argument of this rule (allowed: {', '.join(allowed) or 'none'})")


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

        from .runtime.resolve import model_folder

        folder = model_folder(spec, base_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        from .dtypes import TORCH_DTYPES

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
            enc = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
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
            parts.append(WeightedReward(f"python:{spec.python.function}", 1.0,
                                        load_python_reward(path, spec.python.function), {}))
        if spec.model is not None:
            parts.append(WeightedReward("model", 1.0, remote_model or RewardModel(spec.model, base_dir), {}))
        self.parts = parts

    def score(self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str | None]) -> tuple[list[float], dict[str, float]]:
        """Per-response rewards and the mean of each source (for metrics)."""
        totals = [0.0] * len(responses)
        means: dict[str, float] = {}
        for part in self.parts:
            if hasattr(part.fn, "score_batch"):  # a reward model scores the whole batch at once
                values = part.fn.score_batch(prompts, responses)
                for i, value in enumerate(values):
                    totals[i] += part.weight * value
                means[part.name] = sum(values) / max(1, len(values))
                continue
            values = []
            for i, (prompt, response, answer) in enumerate(zip(prompts, responses, answers)):
                try:
                    value = float(part.fn(prompt, response, answer, **part.args))
                except RewardError:
                    raise
                except Exception as exc:
                    raise RewardError(f"reward {part.name} failed on response {i}: {type(exc).__name__}: {exc}") from exc
                if not math.isfinite(value):
                    raise RewardError(f"reward {part.name} returned {value} on response {i}: rewards must be finite")
                values.append(value)
                totals[i] += part.weight * value
            means[part.name] = sum(values) / max(1, len(values))
        return totals, means
