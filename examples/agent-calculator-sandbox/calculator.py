"""The calculator of examples/agent-calculator.yaml as a function tool: this file's `calc` runs in the
tool sandbox (bubblewrap under `kuberl run`, the job's sandbox pods on a cluster), one process per call,
where the built-in `calculator` runs in the trainer. Exact arithmetic on a parsed expression, never eval:
numbers, + - * / // % **, unary minus and plus, parentheses; sizes bounded so no expression takes long.
"""

import ast
import operator
from fractions import Fraction

MAX_CHARS, MAX_NODES, MAX_EXPONENT, MAX_BITS = 512, 256, 1024, 4096
BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: operator.mod,
}


def _checked(value):
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise ValueError("the result is too large")
    return value


def _eval(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(int(right)) > MAX_EXPONENT:
                raise ValueError(f"exponents are whole numbers up to {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise ValueError("division by zero")
            if max(left.numerator.bit_length(), left.denominator.bit_length()) * abs(int(right)) > MAX_BITS:
                raise ValueError("the result is too large")
            return _checked(left ** int(right))
        if type(node.op) not in BINARY:
            raise ValueError(f"the operator {type(node.op).__name__} is not supported")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        return _checked(BINARY[type(node.op)](left, right))
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def _format(value):
    """An integer as is; a fraction whose decimal expansion ends, as that decimal; any other as p/q."""
    if value.denominator == 1:
        return str(value.numerator)
    d, places = value.denominator, 0
    for p in (2, 5):
        count = 0
        while d % p == 0:
            d, count = d // p, count + 1
        places = max(places, count)
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    return ("-" if value < 0 else "") + digits[:-places] + "." + digits[-places:]


def calc(expression: str) -> str:
    """Evaluates an arithmetic expression exactly (+ - * / // % ** and parentheses)."""
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/").replace(",", "")
    if len(text) > MAX_CHARS:
        raise ValueError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r} as arithmetic") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ValueError("the expression is too long")
    return _format(_eval(tree.body))
