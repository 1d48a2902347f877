"""examples/agent-calculator-sandbox: its function-tool calculator answers as the built-in does, and the job
describes it to the model as the built-in is described (only the name differs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kuberl.engine.agents import build_tools
from kuberl.engine.agents.calculator import evaluate, format_number
from kuberl.engine.config.multi_turn import ToolSpec
from kuberl.operator.validation.manifest import load_rljobs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent-calculator-sandbox"


def example_calc():
    spec = importlib.util.spec_from_file_location("example_calculator", EXAMPLE / "calculator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.calc


@pytest.mark.parametrize(
    "expression",
    ["12 + 30 + 7", "3 + 5 + 5", "1/3 + 1/6", "0.1 + 0.2", "2**10", "-7/8", "10 // 4 % 3", "(2 - 5) * 3", "2^3", "1,000 + 1", "1/3"],
)
def test_the_examples_calculator_answers_as_the_builtin(expression: str) -> None:
    assert example_calc()(expression) == format_number(evaluate(expression))


@pytest.mark.parametrize("expression", ["__import__('os')", "1/0", "2**100000", "x + 1", "1 +"])
def test_the_examples_calculator_refuses_what_the_builtin_refuses(expression: str) -> None:
    with pytest.raises(ValueError):
        example_calc()(expression)


def test_the_job_describes_its_tool_as_the_builtin_calculator_is_described() -> None:
    [job] = load_rljobs(EXAMPLE / "agent-calculator-sandbox.yaml")
    [tool] = job.spec.rollout.multi_turn.tools
    assert tool.kind == "function" and tool.runs_code
    builtin = build_tools([ToolSpec(name="calculator")])["calculator"].schema()["function"]
    assert (tool.description, tool.parameters) == (builtin["description"], builtin["parameters"])
