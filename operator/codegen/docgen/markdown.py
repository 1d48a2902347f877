"""Markdown pieces the generated pages share: their header comment, table cells, code, tables."""

from __future__ import annotations

import html
import json
from typing import Any

COMMAND = ".venv/bin/python -m kuberl.operator.codegen.docgen docs/"


def header(source: str) -> str:
    """The comment every generated page starts with: what it is made from and how to remake it."""
    return (
        f"<!-- Generated from {source} by `{COMMAND}` (or `make docs`). Do not edit this page:\n"
        "     change its source and regenerate; tests/test_docs.py fails when it is stale. -->\n\n"
    )


def cell(text: str, emphasis: bool = False) -> str:
    """Text for a Markdown table cell: one line, no cell separator, no stray HTML, and (unless `emphasis`)
    no emphasis from a star, as in tp*pp*dp; backticks keep making code."""
    text = " ".join(str(text).split()).replace("|", "&#124;").replace("<", "&lt;").replace(">", "&gt;")
    return text if emphasis else text.replace("*", "&#42;")


_MARKDOWN = {c: f"&#{ord(c)};" for c in "\\`*_{}[]()#+!|~"}


def code(value: Any) -> str:
    """A literal in a table cell: HTML code whose Markdown characters are entities, so that a pipe, a bracket
    or an underscore inside it stays literal."""
    text = html.escape(value if isinstance(value, str) else json.dumps(value), quote=False)
    return "<code>" + "".join(_MARKDOWN.get(c, c) for c in text) + "</code>"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
