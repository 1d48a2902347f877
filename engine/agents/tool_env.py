"""The `tools` environment: a turn's tool calls run (concurrently, each within its timeout) and their
results come back as tool messages; a turn without a tool call is the final answer.

Options: fewShot, chat messages put before every question (worked examples of the tools' use).
Calls past rollout.multiTurn.maxToolCallsPerTurn, calls of an unknown tool and calls that cannot be
read are answered with an error message, as a failed call is; the model reads every one.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .environments import Environment, EnvironmentSetup, Observation, register_environment
from .parsers import ToolCall
from .tools import ToolResult


class ToolEnvironment(Environment):
    def __init__(self, setup: EnvironmentSetup, few_shot: list[dict[str, Any]] | None = None):
        self.setup, self.few_shot = setup, [dict(m) for m in few_shot or []]

    def reset(self, example, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The prompt's messages with the few-shot conversation (if any) after its system message."""
        head = messages[:1] if messages and messages[0]["role"] == "system" else []
        return head + [dict(m) for m in self.few_shot] + messages[len(head) :]

    def _run(self, call: ToolCall) -> tuple[ToolResult, float | None]:
        """The call's result and its wall seconds (None: no tool of that name ran)."""
        tool = self.setup.tools.get(call.name)
        if tool is None:
            return ToolResult.failure(f"there is no tool {call.name!r} (tools: {', '.join(sorted(self.setup.tools))})"), None
        started = time.monotonic()
        try:
            result = tool.call(call.arguments)
        except Exception as exc:  # a tool must not end the run: whatever it raised is an error message
            result = ToolResult.failure(f"{type(exc).__name__}: {exc}")
        return result, time.monotonic() - started

    def step(self, text: str) -> Observation:
        parsed = self.setup.parser.parse(text)
        if not parsed.wants_tools:
            return Observation(done=True)
        limit = self.setup.spec.max_tool_calls_per_turn
        calls, extra = parsed.calls[:limit], parsed.calls[limit:]
        if len(calls) > 1:
            with ThreadPoolExecutor(max_workers=len(calls)) as pool:
                ran = list(pool.map(self._run, calls))
        else:
            ran = [self._run(call) for call in calls]
        results = [r for r, _ in ran]
        messages: list[dict[str, Any]] = [{"role": "tool", "name": c.name, "content": r.text} for c, r in zip(calls, results)]
        messages += [
            {
                "role": "tool",
                "name": c.name,
                "content": ToolResult.failure(f"at most {limit} tool calls run per turn; this one did not").text,
            }
            for c in extra
        ]
        messages += [{"role": "tool", "name": "error", "content": ToolResult.failure(e).text} for e in parsed.errors]
        errors = sum(r.error for r in results) + len(extra) + len(parsed.errors)
        return Observation(
            messages,
            tool_calls=len(parsed.calls) + len(parsed.errors),
            tool_errors=errors,
            tool_timeouts=sum(r.timed_out for r in results),
            tool_seconds=tuple(seconds for _, seconds in ran if seconds is not None),
        )


@register_environment("tools", summary="runs the turn's tool calls; a turn without one is the final answer")
def _tools(setup: EnvironmentSetup, few_shot: list[dict[str, Any]] | None = None) -> Environment:
    """few_shot (environmentOptions.fewShot): chat messages put before every prompt's question, e.g.
    worked examples of tool calls and their results (roles system, user, assistant, tool)."""
    for i, message in enumerate(few_shot or []):
        if not (
            isinstance(message, dict)
            and message.get("role") in ("user", "assistant", "tool", "system")
            and isinstance(message.get("content"), str)
        ):
            raise ValueError(f"fewShot[{i}]: a message is {{role: user|assistant|tool|system, content: <text>}}")
    return ToolEnvironment(setup, few_shot)
