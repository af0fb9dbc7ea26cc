"""Turning Hydra/YAML configs into typed dataclass instances, with errors a researcher can act on.

OmegaConf's structured configs already reject unknown keys and wrong types; this module re-raises
those as :class:`ConfigError` naming the full field path, and offers small ``require`` helpers for
the cross-field checks each schema's ``validate()`` performs (paths exist, batch sizes divide, ...).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

T = TypeVar("T")

PRECISIONS = ("bf16", "fp32")
"""Compute precisions by name (training, serving, embedded inference); the torch dtypes are
``models.cosmos3.parallelize.PRECISION_DTYPES``."""


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
    except (ConfigKeyError, ConfigAttributeError) as err:  # a key the schema does not declare (``+foo.bar=1``, a typo in a YAML)
        full_key = str(getattr(err, "full_key", None) or getattr(err, "key", None) or "?")
        raise unknown_key_error(schema, full_key, _first_leaf(cfg, full_key), _first_line(err), root=root) from err
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
        raise ConfigError(_join(root, str(key)), _first_line(err)) from err


def unknown_key_error(schema: type, full_key: str, key: str, problem: str, *, given: str | None = None,
                      root: str = "") -> ConfigError:
    """The error for a key ``schema`` does not declare: names the key as given (``key``, e.g. ``foo.bar``
    for ``+foo.bar=1``), the fields that exist where it was put, and the closest one."""
    parent, _, name = full_key.rpartition(".")
    fields = schema_fields(schema, parent)
    where = f"'{_join(root, parent)}'" if parent or root else "the top level"
    text = f"unknown key ({problem})"
    if fields:
        text += f"; {where} has the fields {', '.join(fields)}"
    close = difflib.get_close_matches(name, fields, n=1)
    fix = f"remove {given or key}"
    if close:
        fix += f", or write {_join(_join(root, parent), close[0])} if that is what you meant"
    else:
        fix += " or correct the key to one of the fields listed"
    return ConfigError(_join(root, key), text, fix)


def schema_fields(schema: type, path: str = "") -> list[str]:
    """The field names the schema declares at the dotted ``path`` (``""``: its top level)."""
    node: Any = OmegaConf.structured(schema)
    for part in [p for p in path.split(".") if p]:
        node = node.get(part) if isinstance(node, DictConfig) else None
    return list(node.keys()) if isinstance(node, DictConfig) else []


def require(condition: bool, field: str, problem: str, fix: str | None = None) -> None:
    """Raise :class:`ConfigError` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, problem, fix)


def require_one_of(value: object, allowed: tuple | list, field: str) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of the ``allowed`` names (the fix lists them)."""
    require(value in allowed, field, f"unknown value '{value}'", f"use one of {list(allowed)}")


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


def _first_leaf(cfg: Any, key: str) -> str:
    """``foo`` -> ``foo.bar`` when ``cfg`` holds ``{foo: {bar: ...}}``: the setting as the user wrote it."""
    node = cfg
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return key
        node = node[part]
    while hasattr(node, "keys") and len(node) > 0:
        first = next(iter(node.keys()))
        key, node = f"{key}.{first}", node[first]
    return key


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
