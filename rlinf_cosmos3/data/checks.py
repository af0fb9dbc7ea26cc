"""Checks that a LeRobot v3 dataset is the LIBERO data the reader's config promises.

Each check raises :class:`DatasetMismatchError` naming the dataset's value and the expected
one, so a wrong dataset (other fps, other camera size, missing key) fails when the reader is
opened instead of training quietly on different data than the model will see at eval time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlinf_cosmos3.data.config import ACTION_KEY, RAW_ACTION_DIM, STATE_DIM, STATE_KEY, LiberoDataConfig

# lerobot's reader only understands the v3 layout.
SUPPORTED_CODEBASE_PREFIX = "v3."


class DatasetMismatchError(ValueError):
    """The dataset on disk does not match what the reader's config expects."""


def check_dataset_layout(root: Path) -> dict[str, Any]:
    """Check that ``root`` holds a local LeRobot v3 dataset; return its ``meta/info.json``.

    Done before lerobot opens the directory, because lerobot falls back to the Hugging Face
    hub when local files are missing, which hangs or fails obscurely on an offline machine.
    """
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise DatasetMismatchError(f"no LeRobot dataset at '{root}': '{info_path}' is missing")
    if not (root / "data").is_dir():
        raise DatasetMismatchError(f"LeRobot dataset at '{root}' has no 'data/' folder")
    info = json.loads(info_path.read_text())
    version = str(info.get("codebase_version", ""))
    if not version.startswith(SUPPORTED_CODEBASE_PREFIX):
        raise DatasetMismatchError(
            f"dataset at '{root}' has codebase_version '{version}', the reader needs a LeRobot v3.x dataset"
        )
    if int(info.get("total_episodes", 0)) < 1:
        raise DatasetMismatchError(f"dataset at '{root}' has no episodes")
    for part in ("meta/tasks.parquet", "meta/episodes"):
        if not (root / part).exists():
            raise DatasetMismatchError(f"LeRobot dataset at '{root}' is incomplete: '{part}' is missing")
    return info


def check_features(fps: int, features: Mapping[str, Mapping[str, Any]], cfg: LiberoDataConfig) -> None:
    """Compare the dataset's fps and feature specs (``meta/info.json``) with ``cfg``."""
    if int(fps) != cfg.fps:
        raise DatasetMismatchError(
            f"dataset fps {fps} != data.fps {cfg.fps}; training and evaluation must use the fps the "
            "action stats were computed at"
        )
    required = [*cfg.image_keys, STATE_KEY, ACTION_KEY]
    missing = [k for k in required if k not in features]
    if missing:
        raise DatasetMismatchError(f"dataset lacks feature(s) {missing}; it has {sorted(features)}")
    _check_vector(features, ACTION_KEY, RAW_ACTION_DIM, "action width")
    _check_vector(features, STATE_KEY, STATE_DIM, "state width")
    for key in cfg.image_keys:
        _check_image(features, key, cfg.image_size)


def check_episodes(total_episodes: int, episode_columns: Sequence[str], cfg: LiberoDataConfig) -> None:
    """Check the episode subset and the success filter against the episode metadata."""
    if cfg.episodes is not None:
        out_of_range = sorted(e for e in cfg.episodes if e >= total_episodes)
        if out_of_range:
            raise DatasetMismatchError(
                f"data.episodes {out_of_range} do not exist: the dataset has episodes 0..{total_episodes - 1}"
            )
    if cfg.successful_only and "success" not in episode_columns:
        raise DatasetMismatchError(
            "data.successful_only is set but the dataset's episode metadata has no 'success' column "
            f"(columns: {sorted(episode_columns)})"
        )


def _check_vector(features: Mapping[str, Mapping[str, Any]], key: str, width: int, what: str) -> None:
    spec = features[key]
    shape = tuple(spec.get("shape", ()))
    if shape != (width,):
        raise DatasetMismatchError(f"{what}: feature '{key}' has shape {list(shape)}, expected [{width}]")
    dtype = spec.get("dtype")
    if dtype not in ("float32", "float64"):
        raise DatasetMismatchError(f"feature '{key}' has dtype '{dtype}', expected float32")


def _check_image(features: Mapping[str, Mapping[str, Any]], key: str, image_size: Sequence[int]) -> None:
    spec = features[key]
    if spec.get("dtype") not in ("video", "image"):
        raise DatasetMismatchError(
            f"feature '{key}' has dtype '{spec.get('dtype')}', expected a video or image"
        )
    shape = list(spec.get("shape", ()))
    names = list(spec.get("names") or [])
    if len(shape) != 3:
        raise DatasetMismatchError(f"image feature '{key}' has shape {shape}, expected 3 dimensions")
    if names[:1] and str(names[0]).startswith("channel"):
        channels, height, width = shape
    else:
        height, width, channels = shape
    expected_h, expected_w = image_size
    if (height, width) != (expected_h, expected_w) or channels != 3:
        raise DatasetMismatchError(
            f"image size mismatch: feature '{key}' is {height}x{width}x{channels} (HxWxC), "
            f"data.image_size expects {expected_h}x{expected_w}x3"
        )
