"""Tools a multi-turn policy may call, behind two registries: the built-ins by name, and the kinds of
tool a job may declare (a built-in, a function of a Python file, an HTTP endpoint).

A tool answers one call's JSON arguments with a `ToolResult`: text for the conversation, or an
error message for it. A tool never raises into the rollout: whatever goes wrong (a timeout, a
crash, too much output, a result that is not text, a refused connection) becomes an error message
the model reads, and the run goes on. A built-in is one file that registers itself with
`@register_tool(name)`; its name must also be in kuberl.engine.config.multi_turn.BUILTIN_TOOLS (the API's list).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..common.registry import Registry
from ..config.multi_turn import ToolSpec
from .isolation import IsolationUnavailable, choose_sandbox

ERROR_CHARS = 500
"""An error message in the conversation is cut to about this many characters."""


class ToolError(ValueError):
    """A tool that cannot be set up (at the start of a run); the message names the field."""


@dataclass(frozen=True)
class ToolResult:
    text: str
    """What the model reads: the result, or the error message."""
    error: bool = False
    timed_out: bool = False

    @classmethod
    def failure(cls, message: str, timed_out: bool = False) -> "ToolResult":
        if len(message) > ERROR_CHARS:  # its start and its end (a traceback's last line says what failed)
            message = message[: ERROR_CHARS // 3] + " ... " + message[-(2 * ERROR_CHARS) // 3 :]
        return cls(f"Error: {message}", error=True, timed_out=timed_out)


class Tool(ABC):
    """One callable tool; `call` is thread-safe (the calls of a step run concurrently)."""

    name: str
    description: str
    parameters: dict[str, Any]
    timeout: float

    def schema(self) -> dict[str, Any]:
        """The tool as chat templates take it (`tools=` of apply_chat_template): OpenAI's function format."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @abstractmethod
    def call(self, arguments: dict[str, Any]) -> ToolResult: ...


ToolFactory = Callable[[ToolSpec, Path], Tool]


@dataclass(frozen=True)
class ToolEntry:
    name: str
    factory: ToolFactory
    summary: str
    sandboxed: bool = False
    """Whether its calls run code in the sandbox (the run then needs one: kuberl.engine.agents.isolation)."""


BUILTIN_TOOLS: Registry[ToolEntry] = Registry("built-in tool")
TOOL_KINDS: Registry[ToolEntry] = Registry("tool kind")


def _register(registry: Registry[ToolEntry], name: str, summary: str, sandboxed: bool) -> Callable[[ToolFactory], ToolFactory]:
    def register(factory: ToolFactory) -> ToolFactory:
        registry[name] = ToolEntry(name, factory, summary, sandboxed)
        return factory

    return register


def register_tool(name: str, *, summary: str, sandboxed: bool = False) -> Callable[[ToolFactory], ToolFactory]:
    """A built-in tool: `factory(spec, base_dir) -> Tool`, chosen by a job's `{name: <name>}`;
    sandboxed: its calls run code through kuberl.engine.agents.isolation.run_in_sandbox."""
    return _register(BUILTIN_TOOLS, name, summary, sandboxed)


def register_tool_kind(kind: str, *, summary: str, sandboxed: bool = False) -> Callable[[ToolFactory], ToolFactory]:
    """A kind of tool (ToolSpec.kind: builtin, function, http): `factory(spec, base_dir) -> Tool`."""
    return _register(TOOL_KINDS, kind, summary, sandboxed)


@register_tool_kind("builtin", summary="one of kuberl's built-in tools, by name")
def _builtin(spec: ToolSpec, base_dir: Path) -> Tool:
    if spec.name not in BUILTIN_TOOLS:
        raise ToolError(f"rollout.multiTurn.tools: {spec.name!r} is not a built-in tool (known: {', '.join(sorted(BUILTIN_TOOLS))})")
    return BUILTIN_TOOLS[spec.name].factory(spec, base_dir)


def sandboxed(spec: ToolSpec) -> bool:
    """Whether the calls of `spec`'s tool run code in the sandbox."""
    if spec.kind == "builtin" and spec.name in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[spec.name].sandboxed
    return TOOL_KINDS[spec.kind].sandboxed


def build_tools(specs: list[ToolSpec], base_dir: Path = Path("."), *, allow_unisolated: bool = False) -> dict[str, Tool]:
    """Every tool of a job by name, set up (a function's schema is read in the sandbox). A job with
    tools that run code first gets its sandbox: bubblewrap, or (allow_unisolated, where bubblewrap
    does not work) plain child processes; else ToolError says what to do."""
    if any(sandboxed(spec) for spec in specs):
        try:
            choose_sandbox(allow_unisolated)
        except IsolationUnavailable as exc:
            raise ToolError(str(exc)) from None
    return {spec.name: TOOL_KINDS[spec.kind].factory(spec, base_dir) for spec in specs}


def resolve(path: str, base_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir / p
