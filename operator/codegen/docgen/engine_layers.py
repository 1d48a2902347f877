"""The engine layers page: the layers of kuberl.engine (its LAYERS, bottom to top) and every module of each
folder with the first sentence of its docstring, so that the map of the engine cannot fall behind it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .markdown import cell, header, table


def first_sentence(docstring: str, limit: int = 240) -> str:
    """The docstring's first sentence (up to a full stop that ends one, within its first paragraph), at most
    `limit` characters (cut at a word, with an ellipsis)."""
    paragraph = " ".join(docstring.strip().split("\n\n", 1)[0].split())
    found = re.search(r"^(.+?\.)(\s|$)", paragraph)
    sentence = found.group(1) if found else paragraph
    return sentence if len(sentence) <= limit else sentence[:limit].rsplit(" ", 1)[0] + " …"


def _modules(folder: Path, repo: Path) -> list[list[str]]:
    rows = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        rows.append([f"`{path.relative_to(repo).as_posix()}`", cell(first_sentence(doc)) if doc else "-"])
    return rows


def page(repo: Path) -> str:
    from kuberl.engine import LAYERS

    engine = repo / "engine"
    text = (
        header("kuberl.engine's LAYERS (engine/__init__.py) and the engine's module docstrings") + "# The engine's layers\n\n"
        "The engine's folders are layers. From the bottom up, each may import from the folders before it and "
        "never from one after it; `tests/test_layers.py` reads every import of every module and fails on an upward "
        "one. Below, each layer with what it holds and each of its modules with the first sentence of its docstring.\n\n"
        + table(["layer", "folder", "what"], [[f"[{name}](#{name})", f"`engine/{name}/`", cell(what)] for name, what in LAYERS])
        + "\n"
    )
    for name, what in LAYERS:
        text += (
            f"## {name}\n\n{cell(what)[0].upper() + cell(what)[1:]}.\n\n" + table(["module", "what"], _modules(engine / name, repo)) + "\n"
        )
    return text
