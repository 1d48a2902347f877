"""The built-in `python`: a snippet run in a sandboxed process (sandbox.py); what it prints is the result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.multi_turn import ToolSpec
from .isolation import run_in_sandbox
from .sandbox import Limits, Outcome
from .tools import Tool, ToolResult, register_tool


def sandbox_failure(outcome: Outcome, limits: Limits) -> ToolResult | None:
    """The error message of a call that did not end well in the sandbox, or None."""
    if outcome.timed_out:
        return ToolResult.failure(f"the tool did not finish within its {limits.timeout:g} s and was stopped", timed_out=True)
    if outcome.printed > limits.max_output_bytes or outcome.printed_too_much:
        return ToolResult.failure(f"the tool printed more than its limit of {limits.max_output_bytes} bytes")
    death = outcome.death()
    return ToolResult.failure(death) if death else None


class PythonTool(Tool):
    def __init__(self, spec: ToolSpec):
        self.name, self.timeout = spec.name, spec.timeout_seconds
        self.limits = Limits(spec.timeout_seconds, spec.memory_mb, spec.max_output_bytes)
        self.description = spec.description or (
            "Runs a Python snippet in a sandbox (no network, no files outside its own folder) and returns what it prints; print the result."
        )
        self.parameters = spec.parameters or {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python code; print() what you want back"}},
            "required": ["code"],
        }

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult.failure('the python tool takes {"code": "<python source>"}')
        outcome = run_in_sandbox({"mode": "python", "code": code}, self.limits)
        failure = sandbox_failure(outcome, self.limits)
        if failure is not None:
            return failure
        text = outcome.output.decode("utf-8", "replace")
        if outcome.reply.get("ok") is False:
            return ToolResult.failure(text.strip() or "the snippet raised an exception")
        return ToolResult(text if text else "(no output: print the result)")


@register_tool("python", summary="a Python snippet in a sandboxed process; its printed output", sandboxed=True)
def _python(spec: ToolSpec, base_dir: Path) -> Tool:
    return PythonTool(spec)
