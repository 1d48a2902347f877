"""Tool-call parsers, behind a registry: how a model family writes a tool call, read back from the
policy's text, and the chat template that teaches the format where the tokenizer's own has none.

A parser is `parse(text) -> ParsedTurn`; it is registered with the template of its format
(`register_parser(name, template=...)`), which rollouts use when the tokenizer's template does not
describe tools (chat.py decides). A malformed call is not an exception: it is an error the model
reads back, as a failed call's would be.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..common.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One message per call that could not be read."""

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


ParseFn = Callable[[str], ParsedTurn]


@dataclass(frozen=True)
class ParserEntry:
    name: str
    parse: ParseFn
    template: str
    """A chat template (Jinja, as tokenizers take) that describes `tools` in this format and renders tool results."""
    summary: str


PARSERS: Registry[ParserEntry] = Registry("tool-call parser")


def register_parser(name: str, *, template: str, summary: str) -> Callable[[ParseFn], ParseFn]:
    def register(fn: ParseFn) -> ParseFn:
        PARSERS[name] = ParserEntry(name, fn, template, summary)
        return fn

    return register


def parser_entry(name: str) -> ParserEntry:
    return PARSERS[name]


# Hermes / Qwen2.5's format in ChatML (<|im_start|>role ... <|im_end|>), as Qwen2.5's own template
# writes it, except that an assistant message is rendered as its text alone: a rollout keeps the
# policy's own tokens, and its tool calls are in that text as the policy wrote them.
HERMES_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


def _call(body: str) -> ToolCall:
    value = json.loads(body)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError('a tool call is {"name": <tool>, "arguments": {...}}')
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError("the arguments of a tool call are a JSON object")
    return ToolCall(value["name"], arguments)


@register_parser(
    "hermes",
    template=HERMES_TEMPLATE,
    summary='Hermes / Qwen: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number per turn',
)
def parse_hermes(text: str) -> ParsedTurn:
    calls, errors = [], []
    for body in _HERMES_CALL.findall(text):
        try:
            calls.append(_call(body.strip()))
        except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
            errors.append(f"could not read the tool call {body.strip()[:200]!r}: {exc}")
    return ParsedTurn(calls, errors)
