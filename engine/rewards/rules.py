"""Rule rewards, by name: pure functions f(prompt, response, answer, **args) -> float. The names are the
API's (RewardRule.name); RULES is their registry."""

from __future__ import annotations

import math
import re
from typing import Callable

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
