"""Agents: what multi-turn rollouts need besides generation, behind registries. Tools (tools.py: the
built-ins calculator.py and python_tool.py, functions of a file in function_tool.py, HTTP endpoints
in http_tool.py, run in the sandbox of sandbox.py), tool-call parsers with their chat templates
(parsers.py), environments (environments.py; tool calling is tool_env.py) and the tokens of a
conversation (chat.py). No torch, no vLLM: the rollout loop is kuberl.engine.rollout.multi_turn."""

from . import calculator as _calculator  # noqa: F401  (registers the built-in tools and kinds)
from . import function_tool as _function_tool  # noqa: F401
from . import http_tool as _http_tool  # noqa: F401
from . import python_tool as _python_tool  # noqa: F401
from . import tool_env as _tool_env  # noqa: F401
from .chat import ChatRenderer, TemplateError, describes_tools
from .environments import ENVIRONMENTS, Environment, EnvironmentSetup, Observation, environment_entry, register_environment
from .parsers import PARSERS, ParsedTurn, ToolCall, parse_hermes, parser_entry, register_parser
from .tools import BUILTIN_TOOLS, TOOL_KINDS, Tool, ToolError, ToolResult, build_tools, register_tool, register_tool_kind

__all__ = [
    "BUILTIN_TOOLS",
    "ChatRenderer",
    "ENVIRONMENTS",
    "Environment",
    "EnvironmentSetup",
    "Observation",
    "PARSERS",
    "ParsedTurn",
    "TOOL_KINDS",
    "TemplateError",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "build_tools",
    "describes_tools",
    "environment_entry",
    "parse_hermes",
    "parser_entry",
    "register_environment",
    "register_parser",
    "register_tool",
    "register_tool_kind",
]
