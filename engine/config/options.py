"""The options of registered functions (estimators, losses): their manifest names, bounds and checks.

An option is a keyword argument of a registered function, with a default. A manifest spells it in
camelCase; where the word is a Python keyword the parameter has another name (GAE's `lam` is the
manifest's `lambda`). A bound is declared on the parameter itself,

    dual_clip: Annotated[float | None, Bound(gt=1.0, why="...")] = None

so that the torch-free catalog carries it and a manifest is refused with the reason before any
model loads, as the engine refuses a call with the same value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_camel, to_snake


@dataclass(frozen=True)
class Bound:
    """Limits of an option (numeric bounds, or the values it may take), and why a value past them cannot train."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    one_of: tuple[Any, ...] | None = None
    """The values it may take (an option typed Literal[...])."""
    why: str = ""

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value`, or None. None and non-numbers are left to the type check."""
        if self.one_of is not None and value is not None and value not in self.one_of:
            return f"must be one of {', '.join(map(str, self.one_of))}, got {value!r}"
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        for limit, ok, word in (
            (self.gt, lambda v, b: v > b, ">"),
            (self.ge, lambda v, b: v >= b, ">="),
            (self.lt, lambda v, b: v < b, "<"),
            (self.le, lambda v, b: v <= b, "<="),
        ):
            if limit is not None and not ok(value, limit):
                return f"must be {word} {limit:g}, got {value!r}" + (f" ({self.why})" if self.why else "")
        return None


# An option's manifest name is its parameter's name in camelCase, except where the manifest's word is a
# Python keyword: GAE's lambda is the parameter `lam` (as ppo.gae.lambda is the field `lam`).
_KEYWORD_OPTIONS = {"lam": "lambda"}


def option_manifest_name(python_name: str) -> str:
    """How a registered function's keyword argument is spelt in a manifest's options."""
    return _KEYWORD_OPTIONS.get(python_name) or to_camel(python_name)


def option_python_name(manifest_name: str) -> str:
    """The keyword argument a manifest's option names (the inverse of option_manifest_name)."""
    for python, manifest in _KEYWORD_OPTIONS.items():
        if manifest_name == manifest:
            return python
    return to_snake(manifest_name)


def option_problems(options: dict[str, Any], known: dict[str, Any], what: str, bounds: dict[str, Bound] | None = None) -> list[str]:
    """What is wrong with `options` (manifest names) for an entry whose options and defaults are
    `known` and whose bounds are `bounds` (both by manifest name)."""
    problems = []
    for key, value in options.items():
        if key not in known:
            problems.append(f"{key}: not an option of {what} (its options: {', '.join(known) or 'none'})")
            continue
        default = known[key]
        wanted = float if isinstance(default, float) else type(default) if default is not None else None
        ok = (
            wanted is None
            or (isinstance(value, wanted) and not (wanted is not bool and isinstance(value, bool)))
            or (wanted is float and isinstance(value, int) and not isinstance(value, bool))
        )
        if not ok:
            problems.append(f"{key}: expected a {wanted.__name__}, got {value!r}")
            continue
        bound = (bounds or {}).get(key)
        problem = bound.problem(value) if bound is not None else None
        if problem:
            problems.append(f"{key}: {problem}")
    return problems
