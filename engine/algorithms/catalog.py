"""Writes engine/config/algorithm_catalog.py: the registries' names, traits and options, without torch.

The API (validation, the CRD, the operator's image) cannot import torch, yet must know which
estimators and losses exist and what each needs. So the registries are the source, and this
generator copies what the API needs into a torch-free module; a test regenerates and compares.

    .venv/bin/python -m kuberl.engine.algorithms.catalog > engine/config/algorithm_catalog.py
"""

from __future__ import annotations

import inspect
import sys

from ..config.algorithm import option_manifest_name

from ..steps import STEPS
from . import ADVANTAGES, POLICY_LOSSES

HEADER = '''"""The registered advantage estimators and policy losses: names, traits and options, without torch.

Generated from kuberl.engine.algorithms' registries. Do not edit: run
`.venv/bin/python -m kuberl.engine.algorithms.catalog > engine/config/algorithm_catalog.py`.
Options are by their manifest (camelCase) names, with their defaults (None: required or unset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CatalogEntry:
    summary: str
    options: dict[str, Any]
    needs_critic: bool = False
    min_samples: int = 1
    needs_greedy: bool = False

'''


def _options(entry: object) -> dict[str, object]:
    return {option_manifest_name(name): (None if default is inspect.Parameter.empty else default) for name, default in entry.options.items()}


def _built_in(entries: dict) -> list[str]:
    """Names registered by kuberl itself, not by a plug-in loaded into this process."""
    return sorted(name for name, e in entries.items() if e.fn.__module__.startswith(("kuberl.engine.algorithms.", "kuberl.engine.steps.")))


def generate() -> str:
    lines = [HEADER, "ADVANTAGES: dict[str, CatalogEntry] = {"]
    for name in _built_in(ADVANTAGES):
        e = ADVANTAGES[name]
        lines.append(f"    {name!r}: CatalogEntry({e.summary!r}, {_options(e)!r}, needs_critic={e.needs_critic!r}, "
                     f"min_samples={e.min_samples!r}, needs_greedy={e.needs_greedy!r}),")
    lines += ["}", "", "POLICY_LOSSES: dict[str, CatalogEntry] = {"]
    for name in _built_in(POLICY_LOSSES):
        e = POLICY_LOSSES[name]
        lines.append(f"    {name!r}: CatalogEntry({e.summary!r}, {_options(e)!r}),")
    lines += ["}", "", "STEPS: dict[str, CatalogEntry] = {"]
    for name in _built_in(STEPS):
        lines.append(f"    {name!r}: CatalogEntry({STEPS[name].summary!r}, {{}}),")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(generate())
