"""A package's public names, imported from their modules on first use (PEP 562).

A package whose ``__init__`` imports every module makes ``import pkg.light_module`` pay for the heavy
ones too: validating an SFT config (it reads ``checkpoint/layout.py``) would import torch. With
:func:`lazy_exports` the ``__init__`` only names where each public name lives.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``; ``homes`` maps each public name to its submodule."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
