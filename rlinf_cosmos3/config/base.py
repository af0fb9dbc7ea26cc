"""Turning Hydra/YAML configs into typed dataclass instances, with errors a researcher can act on.

OmegaConf's structured configs already reject unknown keys and wrong types; this module re-raises
those as :class:`ConfigError` naming the full field path, and offers small ``require`` helpers for
the cross-field checks each schema's ``validate()`` performs (paths exist, batch sizes divide, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid config value: says which field, what is wrong, and how to fix it."""

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"config field '{field}': {problem}"
        if fix:
            message += f" (fix: {fix})"
        super().__init__(message)

    def __reduce__(self) -> tuple:
        # Rebuildable from its fields, so the error survives pickling (Ray actors, multiprocessing).
        return (type(self), (self.field, self.problem, self.fix))


def load_structured(schema: type[T], cfg: Mapping[str, Any] | DictConfig, *, root: str = "") -> T:
    """Merge ``cfg`` onto the dataclass ``schema`` and return a typed instance.

    Unknown keys, missing mandatory values (``???``) and values of the wrong type raise
    :class:`ConfigError` naming the dotted field path.
    """
    if hasattr(cfg, "keys") and "hydra" in cfg:  # Hydra's own section is not part of any schema
        cfg = {k: cfg[k] for k in cfg if k != "hydra"}
    base = OmegaConf.structured(schema)
    try:
        merged = OmegaConf.merge(base, cfg)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            field = _join(root, missing[0])
            raise ConfigError(field, "is required but not set", f"set {field}=<value> in the YAML or on the command line")
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
        raise ConfigError(_join(root, str(key)), _first_line(err)) from err


def require(condition: bool, field: str, problem: str, fix: str | None = None) -> None:
    """Raise :class:`ConfigError` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, problem, fix)


def require_path(value: str | Path | None, field: str, what: str, *, is_dir: bool | None = None) -> Path:
    """Check that a configured path exists (and is a dir/file when asked); return it as a Path."""
    require(value not in (None, ""), field, f"{what} path is not set", f"set {field}=/path/to/{what.replace(' ', '_')}")
    path = Path(str(value)).expanduser()
    require(path.exists(), field, f"{what} not found at '{path}'", "check the path or create it first")
    if is_dir is True:
        require(path.is_dir(), field, f"{what} must be a directory, got a file: '{path}'")
    if is_dir is False:
        require(path.is_file(), field, f"{what} must be a file, got a directory: '{path}'")
    return path


def _join(root: str, key: str) -> str:
    return f"{root}.{key}" if root and key else (root or key)


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
