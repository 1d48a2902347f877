"""The documentation site's generated pages, written from the code they describe.

    .venv/bin/python -m kuberl.operator.codegen.docgen docs/            # write the pages
    .venv/bin/python -m kuberl.operator.codegen.docgen docs/ --check    # exit 1 when a committed page is stale

Six pages are generated, each from its source of truth: the RLJob reference from the API models
(rljob.py), the algorithm reference from the engine's registries (algorithms.py), the metrics list
from the exporters' own registries (metrics.py), the engine's layers from its LAYERS and its modules'
docstrings (engine_layers.py), the model families from the engine's registry of families (models.py)
and the benchmark table from bench/results (bench.py). tests/test_docs.py fails when a committed page differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from . import algorithms, bench, engine_layers, metrics, models, rljob
from .bench import assets
from .markdown import COMMAND


def _pages() -> dict[str, Callable[[Path], str]]:
    return {
        "reference/rljob.md": rljob.page,
        "reference/algorithms.md": algorithms.page,
        "reference/metrics.md": metrics.page,
        "reference/engine.md": engine_layers.page,
        "models.md": models.page,
        "benchmarks.md": bench.page,
    }


def generate(repo: Path) -> dict[str, str | bytes]:
    """Every generated page (and the images they show), by its path under docs/, as the code and bench/results say now."""

    return {**{name: make(repo) for name, make in _pages().items()}, **assets(repo)}


def _differs(path: Path, content: str | bytes) -> bool:
    data = content.encode() if isinstance(content, str) else content
    return not path.is_file() or path.read_bytes() != data


def stale(docs: Path) -> list[str]:
    """The generated pages under `docs` that differ from what `generate` writes (missing ones too)."""
    return [name for name, content in generate(docs.resolve().parent).items() if _differs(docs / name, content)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kuberl.operator.codegen.docgen", description=__doc__.splitlines()[0])
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
