"""The documentation site's generated pages, written from the code they describe:
`python -m kuberl.operator.codegen.docgen docs/` (`--check`: exit 1 when a committed page is stale)."""

from .markdown import COMMAND, cell, code, header, table
from .pages import generate, main, stale

__all__ = ["COMMAND", "cell", "code", "generate", "header", "main", "stale", "table"]
