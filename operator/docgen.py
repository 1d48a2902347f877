"""The documentation site's generated pages, written from the code they describe.

    .venv/bin/python -m kuberl.operator.docgen docs/            # write the pages
    .venv/bin/python -m kuberl.operator.docgen docs/ --check    # exit 1 when a committed page is stale

Four pages are generated, each from its source of truth: the RLJob reference from the API models
(docgen_rljob), the algorithm reference from the engine's registries (docgen_algorithms), the metrics
list from the exporters' own registries (docgen_metrics) and the benchmark table from bench/results
(docgen_bench). tests/test_docs.py fails when a committed page differs from what this writes.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path
from typing import Any, Callable

COMMAND = ".venv/bin/python -m kuberl.operator.docgen docs/"


def header(source: str) -> str:
    """The comment every generated page starts with: what it is made from and how to remake it."""
    return (f"<!-- Generated from {source} by `{COMMAND}` (or `make docs`). Do not edit this page:\n"
            "     change its source and regenerate; tests/test_docs.py fails when it is stale. -->\n\n")


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


def _pages() -> dict[str, Callable[[Path], str]]:
    from . import docgen_algorithms, docgen_bench, docgen_metrics, docgen_rljob

    return {
        "reference/rljob.md": docgen_rljob.page,
        "reference/algorithms.md": docgen_algorithms.page,
        "reference/metrics.md": docgen_metrics.page,
        "benchmarks.md": docgen_bench.page,
    }


def generate(repo: Path) -> dict[str, str | bytes]:
    """Every generated page (and the images they show), by its path under docs/, as the code and bench/results say now."""
    from .docgen_bench import assets

    return {**{name: make(repo) for name, make in _pages().items()}, **assets(repo)}


def _differs(path: Path, content: str | bytes) -> bool:
    data = content.encode() if isinstance(content, str) else content
    return not path.is_file() or path.read_bytes() != data


def stale(docs: Path) -> list[str]:
    """The generated pages under `docs` that differ from what `generate` writes (missing ones too)."""
    return [name for name, content in generate(docs.resolve().parent).items() if _differs(docs / name, content)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kuberl.operator.docgen", description=__doc__.splitlines()[0])
    parser.add_argument("docs", nargs="?", default="docs", help="the site's docs/ folder (the repository is its parent)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    docs = Path(args.docs)
    if args.check:
        names = stale(docs)
        for name in names:
            print(f"stale: {docs / name}: run `{COMMAND}`", file=sys.stderr)
        return 1 if names else 0
    for name, content in generate(docs.resolve().parent).items():
        target = docs / name
        if _differs(target, content):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else content)
            print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
