"""The engine's folders are its layers, and every import points down (or stays within its folder).

A module may import from its own folder and from the folders listed before its own; an import of a
later folder (an upward arrow), at module level or inside a function, fails this test. Read from the
source with `ast`: no import is executed.
"""

from __future__ import annotations

from pathlib import Path

from kuberl.engine import LAYERS as ENGINE_LAYERS

from .python_imports import resolved_imports

ENGINE = Path(__file__).resolve().parent.parent / "engine"

# Bottom to top (engine/__init__.py, which the docs' engine layers page is generated from too).
LAYERS = tuple(name for name, _ in ENGINE_LAYERS)


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["kuberl", "engine"] else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every kuberl.engine import of a file, relative ones resolved."""
    module = ["kuberl", "engine", *path.relative_to(ENGINE).with_suffix("").parts]
    return [(line, name) for line, name in resolved_imports(path.read_text(), module) if name.startswith("kuberl.engine")]


def test_every_engine_folder_is_a_layer() -> None:
    folders = {p.name for p in ENGINE.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert folders == set(LAYERS), f"folders without a layer: {folders - set(LAYERS)}; layers without a folder: {set(LAYERS) - folders}"
    loose = sorted(p.name for p in ENGINE.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside any layer: {loose}"


def test_imports_point_down() -> None:
    upward = []
    for path in sorted(ENGINE.rglob("*.py")):
        own = path.relative_to(ENGINE).parts[0]
        for line, target in _imports(path):
            folder = _folder(target)
            if folder is None or folder == own:
                continue
            if LAYERS.index(folder) > LAYERS.index(own):
                upward.append(f"{path.relative_to(ENGINE.parent)}:{line} imports {target} ({own} -> {folder})")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)
