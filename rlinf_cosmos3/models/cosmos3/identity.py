"""A trained policy's identity: the settings evaluation must reproduce exactly, recorded with the model.

A Cosmos3 policy trained at 20 fps, on a 192x320 side-by-side canvas framed as ``concat_view``,
with 16-step chunks normalised by one stats file, gives wrong actions -- and no error -- when it is
served with another fps, canvas, framing, horizon or stats file. Those settings are declared once,
in :class:`~rlinf_cosmos3.config.model_settings.ModelSettings`; :class:`ModelIdentity` is them plus
the stats file's hash. SFT writes it into every checkpoint (``global_step_<N>/model_identity.json``),
the converter copies it to the root of the diffusers directory, and evaluation compares it with its
``rollout.model.*`` settings before any server or simulator starts.

``num_inference_steps``, the seed, the guidance scale, the flow shift and how the gripper value is
sent (binary or continuous) are choices made at serving time, not fixed by training, so they are
not part of it. The caption style and the dataset's gripper convention are: the model learned that
caption and predicts gripper values in that convention.

``caption_style`` and ``gripper_convention`` came later than the other fields: a file without them
reads as ``diffusers`` and ``zero_one``, the only caption and gripper convention there were then.

This module imports nothing heavy (no torch, diffusers or Ray): configs read it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from rlinf_cosmos3.config.model_settings import ModelSettings, setting_values

IDENTITY_FILE = "model_identity.json"
"""File name in a ``global_step_<N>/`` checkpoint directory and at the root of a converted model."""
IDENTITY_FORMAT_VERSION = 1
OPTIONAL_IN_FILE = ("caption_style", "gripper_convention", "stats_path")
"""Fields a file may lack (written before they existed): read as their defaults, ``diffusers`` and ``zero_one``."""


class IdentityError(ValueError):
    """An identity file that cannot be read: corrupt, from a newer format, or with missing fields."""


@dataclass(frozen=True)
class ModelIdentity(ModelSettings):
    """What the model was trained with: its :class:`ModelSettings` and the stats file's hash. Every field
    but ``stats_path`` must match at serving time."""

    stats_sha256: str = field(kw_only=True)
    """SHA-256 of the action stats file's bytes: the same file, not just the same name."""
    stats_path: str = field(default="", kw_only=True)
    """Where the stats file was when the model was trained: a hint for error messages, never compared."""

    @classmethod
    def of(cls, settings: ModelSettings, stats_path: str | Path) -> ModelIdentity:
        """The identity of a model with ``settings`` whose actions are normalised by the stats file at ``stats_path``."""
        return cls(**setting_values(settings), stats_sha256=file_sha256(stats_path), stats_path=str(stats_path))

    def to_json(self) -> str:
        return json.dumps({"format_version": IDENTITY_FORMAT_VERSION, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "identity") -> ModelIdentity:
        """Parse and check an identity written by :meth:`to_json`; raises :class:`IdentityError`."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise IdentityError(f"{source} is not valid JSON: {err}") from err
        if not isinstance(raw, dict):
            raise IdentityError(f"{source} must hold a JSON object, got {type(raw).__name__}")
        version = raw.pop("format_version", None)
        if not isinstance(version, int) or isinstance(version, bool):
            raise IdentityError(f"{source} has no integer format_version")
        if version > IDENTITY_FORMAT_VERSION:
            raise IdentityError(f"{source} has format_version {version}; this rlinf-cosmos3 reads up to "
                                f"{IDENTITY_FORMAT_VERSION} (update rlinf-cosmos3)")
        declared = get_type_hints(cls)
        required = [f.name for f in fields(cls) if f.name not in OPTIONAL_IN_FILE]
        missing = [name for name in required if name not in raw]
        unknown = sorted(set(raw) - set(declared))
        if missing or unknown:
            raise IdentityError(f"{source}: missing fields {missing}, unknown fields {unknown}")
        for name, value in raw.items():
            expected = declared[name]
            if not isinstance(value, expected) or isinstance(value, bool):
                raise IdentityError(f"{source}: field {name!r} must be {expected.__name__}, got {value!r}")
        return cls(**raw)


COMPARED_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ModelIdentity) if f.name != "stats_path")


@dataclass(frozen=True)
class IdentityMismatch:
    """One setting where the configured value differs from the trained one."""

    field: str
    """The :class:`ModelIdentity` field."""
    model_value: Any
    configured_value: Any
    config_field: str
    """The config field to change (e.g. ``rollout.model.fps``)."""


def compare_identities(trained: ModelIdentity, configured: ModelIdentity,
                       config_fields: Mapping[str, str]) -> list[IdentityMismatch]:
    """Every compared field where ``configured`` differs from ``trained``, in declaration order.

    ``config_fields`` maps each compared field to the config field that sets it.
    """
    missing = [name for name in COMPARED_FIELDS if name not in config_fields]
    if missing:
        raise KeyError(f"no config field given for identity fields {missing}")
    return [IdentityMismatch(name, getattr(trained, name), getattr(configured, name), config_fields[name])
            for name in COMPARED_FIELDS if getattr(trained, name) != getattr(configured, name)]


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def identity_path(directory: str | Path) -> Path:
    return Path(directory) / IDENTITY_FILE


def read_identity(directory: str | Path) -> ModelIdentity | None:
    """The identity stored in a checkpoint or model directory; ``None`` when it has none."""
    path = identity_path(directory)
    if not path.is_file():
        return None
    try:
        text = path.read_text()
    except OSError as err:
        raise IdentityError(f"cannot read {path}: {err}") from err
    return ModelIdentity.from_json(text, source=str(path))


def write_identity(directory: str | Path, identity: ModelIdentity) -> Path:
    """Write ``directory/model_identity.json`` (flushed to disk; callers rename the directory into place)."""
    path = identity_path(directory)
    with open(path, "w") as fh:
        fh.write(identity.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    return path
