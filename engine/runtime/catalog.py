"""Writes engine/config/algorithm_catalog.py: the registries' names, traits and options, and the
presets with their blocks of options, without torch.

The API (validation, the CRD, the operator's image) cannot import torch, yet must know which
estimators, losses, steps and presets exist, what each needs and which options it takes. So the
registries are the source, and this generator copies what the API needs into a torch-free module (a
preset's block, a pydantic model defined in the preset's file, is copied as source); a test
regenerates and compares.

    .venv/bin/python -m kuberl.engine.runtime.catalog > engine/config/algorithm_catalog.py
"""

from __future__ import annotations

import inspect
import sys
import typing
from dataclasses import fields

from ..algorithms import ADVANTAGES, POLICY_LOSSES, PRESETS
from ..config.base import SpecModel
from ..config.options import Bound, option_manifest_name
from ..steps import STEPS

HEADER = '''"""The registered advantage estimators, policy losses, step functions and presets: names, traits,
options and the presets' blocks, without torch.

Generated from kuberl.engine.algorithms' and kuberl.engine.steps' registries. Do not edit: run
`.venv/bin/python -m kuberl.engine.runtime.catalog > engine/config/algorithm_catalog.py`.
Options are by their manifest (camelCase) names, with their defaults (None: required or unset).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from .base import SpecModel
from .options import Bound


@dataclass(frozen=True)
class CatalogEntry:
    summary: str
    options: dict[str, Any]
    bounds: dict[str, Bound] = field(default_factory=dict)
    needs_critic: bool = False
    min_samples: int = 1
    needs_greedy: bool = False
    needs_pi_squared: bool = False
    group_options: dict[str, Any] = field(default_factory=dict)
    pairs: bool = False
    corrects_rollout: bool = False
    on_policy: bool = True


@dataclass(frozen=True)
class PresetEntry:
    summary: str
    advantage: str | None
    policy_loss: str
    step: str
    block: type[SpecModel] | None = None
    pairs: bool = False
    needs_reference: bool = False

'''


def _bound(b: Bound) -> str:
    given = [f"{f.name}={getattr(b, f.name)!r}" for f in fields(b) if getattr(b, f.name) != f.default]
    return f"Bound({', '.join(given)})"


def _options(entry: object) -> dict[str, object]:
    return {
        option_manifest_name(name): (None if default is inspect.Parameter.empty else default) for name, default in entry.options.items()
    }


def _traits(entry: object, names: tuple[str, ...]) -> str:
    """Keyword arguments for the entry's traits that differ from CatalogEntry's defaults."""
    defaults = {
        "needs_critic": False,
        "min_samples": 1,
        "needs_greedy": False,
        "needs_pi_squared": False,
        "group_options": {},
        "pairs": False,
        "corrects_rollout": False,
        "on_policy": True,
    }
    out = []
    for name in names:
        value = getattr(entry, name)
        if name == "group_options":
            value = {option_manifest_name(k): v for k, v in value.items()}
        if value != defaults[name]:
            out.append(f", {name}={value!r}")
    bounds = {option_manifest_name(k): v for k, v in getattr(entry, "bounds", {}).items()}
    if bounds:
        out.insert(0, ", bounds={" + ", ".join(f"{k!r}: {_bound(v)}" for k, v in bounds.items()) + "}")
    return "".join(out)


def _built_in(entries: dict) -> list[str]:
    """Names registered by kuberl itself, not by a plug-in loaded into this process."""
    return sorted(name for name, e in entries.items() if e.fn.__module__.startswith(("kuberl.engine.algorithms.", "kuberl.engine.steps.")))


def _blocks() -> list[type]:
    """The presets' block classes and the SpecModel classes their fields use, each before its users."""
    ordered: list[type] = []

    def visit(cls: type) -> None:
        if cls in ordered:
            return
        for info in cls.model_fields.values():
            for arg in (info.annotation, *typing.get_args(info.annotation)):
                if isinstance(arg, type) and issubclass(arg, SpecModel):
                    visit(arg)
        ordered.append(cls)

    for preset in PRESETS.values():
        if preset.options is not None and preset.options.__module__.startswith("kuberl.engine.algorithms."):
            visit(preset.options)
    return ordered


def generate() -> str:
    lines = [HEADER, "ADVANTAGES: dict[str, CatalogEntry] = {"]
    for name in _built_in(ADVANTAGES):
        e = ADVANTAGES[name]
        traits = _traits(e, ("needs_critic", "min_samples", "needs_greedy", "needs_pi_squared", "group_options"))
        lines.append(f"    {name!r}: CatalogEntry({e.summary!r}, {_options(e)!r}{traits}),")
    lines += ["}", "", "POLICY_LOSSES: dict[str, CatalogEntry] = {"]
    for name in _built_in(POLICY_LOSSES):
        e = POLICY_LOSSES[name]
        lines.append(f"    {name!r}: CatalogEntry({e.summary!r}, {_options(e)!r}{_traits(e, ('pairs', 'corrects_rollout'))}),")
    lines += ["}", "", "STEPS: dict[str, CatalogEntry] = {"]
    for name in _built_in(STEPS):
        lines.append(f"    {name!r}: CatalogEntry({STEPS[name].summary!r}, {{}}{_traits(STEPS[name], ('on_policy',))}),")
    lines += ["}", "", "", "# The presets' blocks of options, as engine/algorithms/presets/*.py defines them.", ""]
    for cls in _blocks():
        lines += [inspect.getsource(cls).rstrip(), "", ""]
    presets = [p for p in PRESETS.values() if p.module.startswith("kuberl.engine.algorithms.")]
    lines.append("PRESETS: dict[str, PresetEntry] = {")
    for p in presets:
        block = p.options.__name__ if p.options is not None else "None"
        traits = "".join(f", {t}=True" for t in ("pairs", "needs_reference") if getattr(p, t))
        lines.append(f"    {p.name!r}: PresetEntry({p.summary!r}, {p.advantage!r}, {p.policy_loss!r}, {p.step!r}, {block}{traits}),")
    lines += [
        "}",
        "",
        f"AlgorithmName = Literal[{', '.join(repr(p.name) for p in presets)}]",
        "",
        "",
        "class PresetBlocks(SpecModel):",
        '    """Each preset\'s own block of options, by the preset\'s name: a block applies only with its preset."""',
        "",
    ]
    for p in presets:
        if p.options is not None:
            lines += [f"    {p.name}: {p.options.__name__} | None = None", f'    """{p.name}\'s options (only with name: {p.name})."""']
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(generate())
