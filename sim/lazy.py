"""Package attributes that load their module on first use.

A package ``__init__`` that imports its submodules eagerly makes every ``python -m sim``
command pay for all of them (pandas, pydantic, the engine) before it parses its first
argument. Packages instead declare which module holds each public name::

    __getattr__ = lazy_attributes(__name__, {"run": "sim.runner", "plots": "sim.report"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``: ``homes[name]`` is the module defining ``name``
    (or, when it has no such attribute, the parent of the submodule ``name``)."""

    def load(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(homes[name])
        value = getattr(module, name) if hasattr(module, name) else importlib.import_module(f"{homes[name]}.{name}")
        setattr(sys.modules[package], name, value)
        return value

    return load
