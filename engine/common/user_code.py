"""Importing a user's Python file (a reward function, algorithm plug-ins), with errors that name the field."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def import_user_file(path: Path, field: str, error: type[ValueError], kind: str) -> ModuleType:
    """The module of the file at `path`; `error` names `field` when the file is missing or fails to import.

    `kind` keeps the module names of different uses of one file apart (each import registers anew).
    """
    if not path.is_file():
        raise error(f"{field}: {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"kuberl_user_{kind}_{abs(hash(str(path.resolve())))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: report what broke, where
        raise error(f"{field}: importing {path} failed: {type(exc).__name__}: {exc}") from None
    return module
