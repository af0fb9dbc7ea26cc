"""The ``data.dataset`` section: settings of the LIBERO training-sample reader, and the dataset's
feature keys and widths (what :mod:`rlinf_cosmos3.demos.lerobot_writer` writes and the reader reads).

Several fields (fps, num_frames, image size, normalisation method, stats file) are part of a
model's identity: the same values must be used at evaluation time, so the reader refuses a
dataset that disagrees with them instead of silently resampling or resizing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.config.model_settings import GRIPPER_CONVENTIONS, NORMALIZATIONS, RECIPE

SUPPORTED_NORMALIZATIONS = NORMALIZATIONS
"""Normalisation methods the reader knows how to apply to the 10-D actions."""

MAIN_IMAGE_KEY = "observation.images.image"
WRIST_IMAGE_KEY = "observation.images.wrist_image"
STATE_KEY = "observation.state"
ACTION_KEY = "action"


@dataclass
class LiberoDataConfig:
    """Where the LeRobot v3 dataset lives and how samples are cut from it.

    A sample at frame ``t`` holds the ``num_frames`` camera frames ``t .. t+num_frames-1`` and
    the ``chunk_length`` actions ``t .. t+chunk_length-1`` (17 frames / 16 actions by default).
    """

    root: str = "???"
    """Local dataset directory (the one holding ``meta/info.json``); read offline."""
    repo_id: str = "local/libero"
    """Name lerobot files the dataset under; only used as a label when ``root`` is given."""
    stats_path: str = "???"
    """Action stats JSON (``libero_native_frame_wise_relative_rot6d.json``)."""
    # The model settings this section sets (DATA_SETTING_KEYS; declared in config/model_settings.py).
    chunk_length: int = RECIPE.action_horizon
    num_frames: int = RECIPE.num_frames
    fps: int = RECIPE.fps
    normalization: str = RECIPE.normalization
    gripper_convention: str = RECIPE.gripper_convention
    """How the dataset stores the gripper: ``zero_one`` (g in [0, 1], 1 = open; ours and NVIDIA's),
    ``pm_one`` (-1 open / +1 close, the community ``lerobot/libero_*`` sets) or ``pm_one_flip``
    (signs inverted). Part of the model's identity: evaluation turns predictions back into commands
    by it (:mod:`rlinf_cosmos3.actions.gripper`)."""
    image_keys: list[str] = field(default_factory=lambda: [MAIN_IMAGE_KEY, WRIST_IMAGE_KEY])
    image_size: list[int] = field(default_factory=lambda: [256, 256])
    """Expected stored frame size as ``[height, width]``."""
    episodes: list[int] | None = None
    """Optional subset of episode indexes; ``None`` reads all episodes."""
    successful_only: bool = False
    """Keep only episodes whose metadata has ``success == True`` (the column must exist)."""
    complete_chunks_only: bool = True
    """Start samples only where all frames and actions lie inside the episode (no padding), as
    cosmos-framework's LIBERO loader and the action stats do (the recipe's setting); false: every
    frame starts a sample and the masks mark the padded tail."""

    def validate(self) -> None:
        """Check the values that do not need the dataset; raises :class:`ConfigError` naming the field."""
        _require(self.root not in ("", "???"), "root", "dataset root is not set")
        _require(self.stats_path not in ("", "???"), "stats_path", "action stats file is not set")
        _require(self.chunk_length >= 1, "chunk_length", f"must be >= 1, got {self.chunk_length}")
        _require(self.num_frames >= 1, "num_frames", f"must be >= 1, got {self.num_frames}")
        _require(self.fps >= 1, "fps", f"must be >= 1, got {self.fps}")
        _require(
            self.normalization in SUPPORTED_NORMALIZATIONS,
            "normalization",
            f"unknown normalization '{self.normalization}', expected one of {list(SUPPORTED_NORMALIZATIONS)}",
        )
        _require(
            self.gripper_convention in GRIPPER_CONVENTIONS,
            "gripper_convention",
            f"unknown gripper convention '{self.gripper_convention}', expected one of {list(GRIPPER_CONVENTIONS)}",
        )
        _require(len(self.image_keys) >= 1, "image_keys", "at least one camera key is needed")
        _require(
            len(set(self.image_keys)) == len(self.image_keys),
            "image_keys",
            f"duplicate keys in {self.image_keys}",
        )
        short = [image_output_name(k) for k in self.image_keys]
        _require(
            len(set(short)) == len(short),
            "image_keys",
            f"keys {self.image_keys} map to clashing sample names {short}",
        )
        _require(
            len(self.image_size) == 2 and all(v >= 1 for v in self.image_size),
            "image_size",
            f"must be [height, width] with positive values, got {self.image_size}",
        )
        if self.episodes is not None:
            _require(
                len(self.episodes) >= 1,
                "episodes",
                "an empty episode subset selects nothing (use null for all)",
            )
            _require(
                all(e >= 0 for e in self.episodes), "episodes", f"negative episode index in {self.episodes}"
            )


DATA_SETTING_KEYS = {"fps": "fps", "action_horizon": "chunk_length", "num_frames": "num_frames",
                     "normalization": "normalization", "gripper_convention": "gripper_convention"}
"""Model setting -> the ``data.dataset`` key that sets it (read with ``config.model_settings.read_settings``)."""


def image_output_name(key: str) -> str:
    """Sample key for a camera: the last dotted part (``observation.images.wrist_image`` -> ``wrist_image``)."""
    return key.rsplit(".", 1)[-1]


def _require(condition: bool, name: str, problem: str) -> None:
    if not condition:
        raise ConfigError(f"data.{name}", problem)
