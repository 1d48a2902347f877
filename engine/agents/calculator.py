"""The built-in `calculator`: exact arithmetic on a parsed expression, never `eval`.

The expression is parsed with Python's `ast` and walked over an allow-list of nodes (numbers, + - *
/ // % **, unary minus and plus, parentheses); anything else (a name, a call, an attribute) is an
error message. Numbers are exact fractions, so 0.1 + 0.2 is 0.3 and 1/3 stays 1/3. Sizes are
bounded so that no expression can take long: its length, its nodes, exponents, and the digits of
every intermediate result.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

from ..config.multi_turn import ToolSpec
from .tools import Tool, ToolResult, register_tool

MAX_CHARS = 512
MAX_NODES = 256
MAX_EXPONENT = 1024
MAX_BITS = 4096
"""About 1200 decimal digits: the largest numerator or denominator of any intermediate result."""

_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: operator.mod,
}


class CalculatorError(ValueError):
    pass


def _checked(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise CalculatorError("the result is too large")
    return value


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError("only whole-number exponents are exact")
    n = int(exponent)
    if abs(n) > MAX_EXPONENT:
        raise CalculatorError(f"exponents are limited to {MAX_EXPONENT}")
    if base == 0 and n < 0:
        raise CalculatorError("division by zero")
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if size * abs(n) > MAX_BITS:
        raise CalculatorError("the result is too large")
    return base**n


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and (type(node.value) is int or type(node.value) is float):
        return _checked(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise CalculatorError(f"the operator {type(node.op).__name__} is not supported")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        return _checked(fn(left, right))
    raise CalculatorError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression ("12 + 7 * (3 - 1)", "2**10", "1/3 + 1/6")."""
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/").replace(",", "")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r} as arithmetic") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError("the expression is too long")
    return _eval(tree)


def format_number(value: Fraction) -> str:
    """An integer as is; a fraction whose decimal expansion ends, as that decimal; any other as p/q."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    twos = fives = 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    return ("-" if value < 0 else "") + digits[:-places] + "." + digits[-places:]


class Calculator(Tool):
    def __init__(self, spec: ToolSpec):
        self.name, self.timeout = spec.name, spec.timeout_seconds
        self.description = spec.description or "Evaluates an arithmetic expression exactly (+ - * / // % ** and parentheses)."
        self.parameters = spec.parameters or {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression, e.g. 12 + 7 * (3 - 1)"}},
            "required": ["expression"],
        }

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return ToolResult.failure('the calculator takes {"expression": "<arithmetic>"}')
        try:
            return ToolResult(format_number(evaluate(expression)))
        except (CalculatorError, ZeroDivisionError, OverflowError, RecursionError, ValueError) as exc:
            return ToolResult.failure(str(exc) or type(exc).__name__)


@register_tool("calculator", summary="exact arithmetic on an expression (parsed, never eval'd)")
def _calculator(spec: ToolSpec, base_dir: Path) -> Tool:
    return Calculator(spec)
