"""Config schemas: every YAML section declared once as a dataclass, validated once, before any worker."""

from rlinf_cosmos3.config.base import ConfigError, load_structured, require, require_path

__all__ = ["ConfigError", "load_structured", "require", "require_path"]
