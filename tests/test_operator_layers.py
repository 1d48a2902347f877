"""operator/'s folders are its layers, and every import points down (or stays within its folder).

Bottom to top as kuberl.operator.LAYERS lists them; kuberl.client sits between control and cli (the
command line uses it; it uses the API and the children's labels). Read from the source with `ast`, so
an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

from pathlib import Path

from kuberl.operator import LAYERS as OPERATOR_LAYERS

from .python_imports import resolved_imports

REPO = Path(__file__).resolve().parent.parent
OPERATOR, CLIENT = REPO / "operator", REPO / "client"
LAYERS = tuple(name for name, _ in OPERATOR_LAYERS)
ORDER = (*LAYERS[: LAYERS.index("cli")], "client", *LAYERS[LAYERS.index("cli") :])
"""Every layer with the client in its place."""


def _module(path: Path) -> list[str]:
    if path.is_relative_to(OPERATOR):
        return ["kuberl", "operator", *path.relative_to(OPERATOR).with_suffix("").parts]
    return ["kuberl", "client", *path.relative_to(CLIENT).with_suffix("").parts]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["kuberl", "client"]:
        return "client"
    if parts[:2] == ["kuberl", "operator"] and len(parts) > 2:
        return parts[2] if parts[2] in LAYERS else "loose"
    return None


def _imports(source: str, module: list[str]) -> list[tuple[int, str]]:
    """(line, module) of every kuberl.operator and kuberl.client import in `module`'s source, relative ones resolved."""
    return [(line, name) for line, name in resolved_imports(source, module) if _layer(name) is not None]


def _sources() -> list[Path]:
    return sorted(p for p in [*OPERATOR.rglob("*.py"), *CLIENT.rglob("*.py")] if "__pycache__" not in p.parts)


def test_every_operator_folder_is_a_layer() -> None:
    folders = {p.name for p in OPERATOR.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert folders == set(LAYERS), f"folders without a layer: {folders - set(LAYERS)}; layers without a folder: {set(LAYERS) - folders}"
    loose = sorted(p.name for p in OPERATOR.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside any layer: {loose}"


def _upward(source: str, module: list[str], where: str) -> list[str]:
    own = _layer(".".join(module))
    if own is None or own == "loose":
        return []
    found = []
    for line, target in _imports(source, module):
        layer = _layer(target)
        if layer is None or layer == own or target == "kuberl.operator":
            continue
        if layer == "loose" or ORDER.index(layer) > ORDER.index(own):
            found.append(f"{where}:{line} imports {target} ({own} -> {layer})")
    return found


def test_imports_point_down() -> None:
    upward = [u for path in _sources() for u in _upward(path.read_text(), _module(path), str(path.relative_to(REPO)))]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_an_upward_import_is_caught_wherever_it_is_written() -> None:
    control = ["kuberl", "operator", "control", "planner"]
    assert _upward("from ..cli.commands import main\n", control, "p")  # relative, at the top
    assert _upward("def f():\n    from kuberl.client import RLJobClient\n", control, "p")  # absolute, in a function
    assert _upward("from ..testing.node import RealNode\n", ["kuberl", "operator", "cli", "smoke"], "p")
    assert not _upward("from ..api import RLJob\nfrom .children import LABEL_JOB\n", control, "p")
    assert not _upward("from kuberl.operator.control.children import LABEL_JOB\n", ["kuberl", "client", "logs"], "p")
