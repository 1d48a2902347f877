"""Tools that are a function of the user's Python file: each call runs in a sandboxed process.

The file is never imported into the trainer: its schema (when the job gives none) is read from the
function's signature and docstring in the sandbox too, once, at the start of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.multi_turn import ToolSpec
from .python_tool import sandbox_failure
from .isolation import run_in_sandbox
from .sandbox import Limits
from .tools import Tool, ToolError, ToolResult, register_tool_kind, resolve


class FunctionTool(Tool):
    def __init__(self, spec: ToolSpec, base_dir: Path):
        assert spec.path is not None
        self.name, self.timeout = spec.name, spec.timeout_seconds
        self.path, self.function = resolve(spec.path, base_dir), spec.function or spec.name
        self.limits = Limits(spec.timeout_seconds, spec.memory_mb, spec.max_output_bytes)
        field = f"rollout.multiTurn.tools[{spec.name}]"
        if not self.path.is_file():
            raise ToolError(f"{field}.path: {self.path} does not exist")
        # Read here, once: the sandbox sees none of the trainer's files.
        self.source = self.path.read_text(encoding="utf-8", errors="replace")
        described: dict[str, Any] = {}
        if spec.description is None or spec.parameters is None:
            outcome = run_in_sandbox(
                {"mode": "describe", "path": str(self.path), "source": self.source, "function": self.function},
                Limits(max(spec.timeout_seconds, 30.0), spec.memory_mb, spec.max_output_bytes),
            )
            if "schema" not in outcome.reply:
                why = outcome.reply.get("error") or outcome.death() or "no schema"
                raise ToolError(f"{field}: reading {self.function} of {self.path} failed: {why}")
            described = outcome.reply["schema"]
        self.description = spec.description or described["description"]
        self.parameters = spec.parameters or described["parameters"]

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        outcome = run_in_sandbox(
            {"mode": "function", "path": str(self.path), "source": self.source, "function": self.function, "arguments": arguments},
            self.limits,
        )
        failure = sandbox_failure(outcome, self.limits)
        if failure is not None:
            return failure
        if "error" in outcome.reply:
            return ToolResult.failure(str(outcome.reply["error"]))
        return ToolResult(str(outcome.reply.get("text", "")))


@register_tool_kind("function", summary="a function of a Python file, called in a sandboxed process", sandboxed=True)
def _function(spec: ToolSpec, base_dir: Path) -> Tool:
    return FunctionTool(spec, base_dir)
