"""The step's tool-call latency: each call the tools environment runs is timed, the trajectory keeps the
times, and the step reports their mean and p90 (multi_turn/tool_seconds_mean, _p90)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kuberl.engine.agents import ChatRenderer, EnvironmentSetup, parser_entry
from kuberl.engine.agents.tools import Tool, ToolResult
from kuberl.engine.config import DataSpec
from kuberl.engine.config.multi_turn import MultiTurnSpec, ToolSpec
from kuberl.engine.data import Example, PromptEncoder
from kuberl.engine.rollout.generation import Generator
from kuberl.engine.rollout.multi_turn import MultiTurnRollout
from kuberl.engine.rollout.trajectory import Trajectory
from kuberl.engine.rollout.vllm_backend import Sampling
from kuberl.engine.steps.multi_turn import multi_turn_metrics, nearest_rank

from .conftest import ScriptedRollout

CALL = '<tool_call>\n{{"name": "{}", "arguments": {{"seconds": {}}}}}\n</tool_call>'


class Sleeper(Tool):
    """Sleeps the seconds it is given, then answers "slept"."""

    def __init__(self, name: str):
        self.name, self.timeout, self.description = name, 5.0, "sleeps"
        self.parameters = {"type": "object", "properties": {"seconds": {"type": "number"}}}

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        time.sleep(arguments["seconds"])
        return ToolResult("slept")


def reply(prompt: str, sample: int) -> str:
    """Turn 1: two calls at once (0.2 s and 0.4 s) and one of a tool that does not exist; turn 2: 0.1 s; then done."""
    if prompt.count("<tool_response>") >= 4:
        return "done"
    if "<tool_response>" in prompt:
        return CALL.format("sleep", 0.1)
    return CALL.format("sleep", 0.2) + CALL.format("sleep", 0.4) + CALL.format("missing", 0)


def test_each_tool_call_is_timed_and_the_step_reports_mean_and_p90(tool_tokenizer_for_tools) -> None:
    tok = tool_tokenizer_for_tools
    spec = MultiTurnSpec(tools=[ToolSpec(name="calculator")], max_turns=4, max_total_tokens=400, max_tool_calls_per_turn=3)
    tools: dict[str, Tool] = {"sleep": Sleeper("sleep")}
    schemas = [t.schema() for t in tools.values()]
    encoder = PromptEncoder(tok, DataSpec(train={"generator": {"name": "arithmetic"}}), tools=schemas)
    rollout = MultiTurnRollout(
        Generator(ScriptedRollout(tok, reply), 0, 1, 1),
        ChatRenderer(tok, schemas),
        EnvironmentSetup(spec, tools, parser_entry(spec.parser)),
        encoder,
        512,
        (tok.eos_token_id,),
    )
    _, [t] = rollout.generate([Example("What is 1 + 1?", "2")], Sampling(max_new_tokens=200), seed=0)

    assert (t.turns, t.tool_calls, t.tool_errors) == (3, 4, 1)
    # The unknown tool's call ran nothing and is not timed; the two of turn 1 ran at once, each timed alone.
    first, second, third = t.tool_seconds
    assert 0.2 <= first < 0.35 and 0.4 <= second < 0.55 and 0.1 <= third < 0.25, t.tool_seconds
    metrics = multi_turn_metrics([t])
    assert metrics["multi_turn/tool_seconds_mean"] == pytest.approx(sum(t.tool_seconds) / 3)
    assert metrics["multi_turn/tool_seconds_p90"] == second


def test_p90_is_the_nearest_rank_and_a_step_without_tool_calls_reports_none() -> None:
    assert nearest_rank([float(i) for i in range(10, 0, -1)], 0.9) == 9.0
    assert nearest_rank([float(i) for i in range(1, 12)], 0.9) == 10.0
    assert nearest_rank([3.0], 0.9) == 3.0
    timed = [Trajectory(0, [1], [0.0], True, tool_seconds=(0.5,) * 9 + (2.0,)), Trajectory(0, [1], [0.0], True)]
    metrics = multi_turn_metrics(timed)
    assert metrics["multi_turn/tool_seconds_mean"] == pytest.approx(0.65)
    assert metrics["multi_turn/tool_seconds_p90"] == 0.5
    untimed = multi_turn_metrics([Trajectory(0, [1], [0.0], True)])
    assert "multi_turn/tool_seconds_mean" not in untimed and "multi_turn/tool_seconds_p90" not in untimed
