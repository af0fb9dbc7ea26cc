"""Config schemas: every YAML section declared once as a dataclass, validated once, before any worker.

The names are loaded on first use (PEP 562): :mod:`~rlinf_cosmos3.config.model_settings` is read by
``actions/`` and ``models/``, which also import in the simulator environment, where OmegaConf (that
``config.base`` needs) is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlinf_cosmos3.lazy_exports import lazy_exports

_HOMES = {"ConfigError": "base", "load_structured": "base", "require": "base", "require_path": "base"}
"""Public name -> the module of this package that defines it."""

__all__ = ["ConfigError", "load_structured", "require", "require_path"]

if TYPE_CHECKING:
    from rlinf_cosmos3.config.base import ConfigError, load_structured, require, require_path

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
