"""The model families the engine trains, one module each in this folder (registry.py says what a family declares).

Every module here but the registry is a family and is imported, in the order of its name, so that adding a
family is adding its file (and its test): nothing else lists them.
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import FAMILIES, ModelFamily, Parallelism, Refusal, family_of, register_family, supported_model_types

__all__ = ["FAMILIES", "ModelFamily", "Parallelism", "Refusal", "family_of", "register_family", "supported_model_types"]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "registry":
        importlib.import_module(f"{__name__}.{_module}")
