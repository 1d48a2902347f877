"""Every import a Python source makes, read with `ast` (nothing is executed), relative ones resolved:
what the layer tests (test_layers.py, test_operator_layers.py) check against their layers."""

from __future__ import annotations

import ast


def resolved_imports(source: str, module: list[str]) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, the module `module` (its dotted parts, ending in
    "__init__" for a package's own file), at module level or inside a function. `from . import x` gives
    the package's `x`, which may be a module."""
    package = module[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
            else:
                names = [node.module or ""]
            found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found
