"""Checks that a LeRobot v3 dataset is the LIBERO data the reader's config promises.

Each check raises :class:`DatasetMismatchError` naming the config field the dataset disagrees
with, the dataset's value, the expected one and the fix, so a wrong dataset (other fps, other
camera size, missing key) fails before training instead of training quietly on different data
than the model will see at eval time.

Everything here reads only ``meta/info.json`` (and, for ``successful_only``, the schema of the
episode metadata), never lerobot or torch: the SFT driver runs the same checks in its config
validation (:func:`check_dataset_info`), before Ray or any rank starts, and the reader runs them
again when it opens the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlinf_cosmos3.config.data import ACTION_KEY, STATE_KEY, LiberoDataConfig
from rlinf_cosmos3.config.libero_suites import ACTION_DIM, STATE_DIM

# lerobot's reader only understands the v3 layout.
SUPPORTED_CODEBASE_PREFIX = "v3."
# How a camera may be stored: "video" (MP4 files, decoded by PyAV) or "image" (PNG frames embedded
# in the data parquet files, as LeRobotDataset.create(..., use_videos=False) writes them).
CAMERA_DTYPES = ("video", "image")
VECTOR_DTYPES = ("float32", "float64")


class DatasetMismatchError(ValueError):
    """The dataset on disk does not match what the reader's config expects.

    ``field`` is the :class:`LiberoDataConfig` field the dataset disagrees with (``root`` when the
    dataset itself is wrong), so callers can report it as ``data.<field>`` or ``data.dataset.<field>``.
    """

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(problem + (f" (fix: {fix})" if fix else ""))

    def __reduce__(self) -> tuple:
        # Rebuildable from its fields, so the error survives DataLoader workers and Ray.
        return (type(self), (self.field, self.problem, self.fix))


def check_dataset_info(cfg: LiberoDataConfig) -> dict[str, Any]:
    """Every check that needs only the files under ``cfg.root``; returns ``meta/info.json``.

    Layout, fps, camera/state/action features and the episode selection. Used by the SFT
    driver's config validation and by the reader.
    """
    root = Path(cfg.root).expanduser()
    info = check_dataset_layout(root)
    check_features(info.get("fps", 0), info.get("features") or {}, cfg)
    columns = episode_metadata_columns(root) if cfg.successful_only else ()
    check_episodes(int(info.get("total_episodes", 0)), columns, cfg)
    return info


def check_dataset_layout(root: Path) -> dict[str, Any]:
    """Check that ``root`` holds a local LeRobot v3 dataset; return its ``meta/info.json``.

    Done before lerobot opens the directory, because lerobot falls back to the Hugging Face
    hub when local files are missing, which hangs or fails obscurely on an offline machine.
    """
    fix = "point the dataset root at a local LeRobot v3 dataset directory (the one holding meta/info.json)"
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise DatasetMismatchError("root", f"no LeRobot dataset at '{root}': '{info_path}' is missing", fix)
    if not (root / "data").is_dir():
        raise DatasetMismatchError("root", f"LeRobot dataset at '{root}' has no 'data/' folder", fix)
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as err:
        raise DatasetMismatchError("root", f"cannot read '{info_path}': {err}", fix) from err
    version = str(info.get("codebase_version", ""))
    if not version.startswith(SUPPORTED_CODEBASE_PREFIX):
        raise DatasetMismatchError(
            "root",
            f"dataset at '{root}' has codebase_version '{version}', the reader needs a LeRobot v3.x dataset",
            "convert it with lerobot's v2.1 -> v3.0 conversion script, or record a new one",
        )
    if int(info.get("total_episodes", 0)) < 1:
        raise DatasetMismatchError("root", f"dataset at '{root}' has no episodes", fix)
    for part in ("meta/tasks.parquet", "meta/episodes"):
        if not (root / part).exists():
            raise DatasetMismatchError("root", f"LeRobot dataset at '{root}' is incomplete: '{part}' is missing", fix)
    return info


def check_features(fps: int, features: Mapping[str, Mapping[str, Any]], cfg: LiberoDataConfig) -> None:
    """Compare the dataset's fps and feature specs (``meta/info.json``) with ``cfg``."""
    if int(fps) != cfg.fps:
        raise DatasetMismatchError(
            "fps",
            f"dataset fps {fps} != data.fps {cfg.fps}; training and evaluation must use the fps the "
            "action stats were computed at",
            "use a dataset recorded at this fps (lerobot does not resample)",
        )
    cameras = _camera_features(features)
    missing_cameras = [k for k in cfg.image_keys if k not in features]
    if missing_cameras:
        raise DatasetMismatchError(
            "image_keys",
            f"dataset lacks feature(s) {missing_cameras}; it has {sorted(features)}",
            f"list only the dataset's cameras in image_keys (it has {cameras}) or use a dataset with them",
        )
    missing = [k for k in (STATE_KEY, ACTION_KEY) if k not in features]
    if missing:
        raise DatasetMismatchError(
            "root",
            f"dataset lacks feature(s) {missing}; it has {sorted(features)}",
            f"use a LIBERO dataset with a {ACTION_DIM}-D '{ACTION_KEY}' and a {STATE_DIM}-D '{STATE_KEY}'",
        )
    _check_vector(features, ACTION_KEY, ACTION_DIM, "action width")
    _check_vector(features, STATE_KEY, STATE_DIM, "state width")
    for key in cfg.image_keys:
        _check_image(features, key, cfg.image_size, cameras)


def check_episodes(total_episodes: int, episode_columns: Sequence[str], cfg: LiberoDataConfig) -> None:
    """Check the episode subset and the success filter against the episode metadata."""
    if cfg.episodes is not None:
        out_of_range = sorted(e for e in cfg.episodes if e >= total_episodes)
        if out_of_range:
            raise DatasetMismatchError(
                "episodes",
                f"data.episodes {out_of_range} do not exist: the dataset has episodes 0..{total_episodes - 1}",
                "select existing episodes or set episodes to null (all)",
            )
    if cfg.successful_only and "success" not in episode_columns:
        raise DatasetMismatchError(
            "successful_only",
            "data.successful_only is set but the dataset's episode metadata has no 'success' column "
            f"(columns: {sorted(episode_columns)})",
            "set successful_only=false, or record the dataset with a recorder that marks success",
        )


def count_training_samples(cfg: LiberoDataConfig) -> int:
    """The number of samples the reader will give, from ``meta/episodes`` alone (no frame is read).

    Every frame of a selected episode starts a sample; with ``complete_chunks_only`` only those
    whose window of ``max(num_frames, chunk_length)`` frames lies inside the episode. Raises
    :class:`DatasetMismatchError` when nothing is left, as the reader would.
    """
    import pyarrow.parquet as pq

    root = Path(cfg.root).expanduser()
    columns = ["episode_index", "length"] + (["success"] if cfg.successful_only else [])
    files = sorted((root / "meta" / "episodes").rglob("*.parquet"))
    rows: list[dict[str, Any]] = []
    for path in files:
        rows += pq.read_table(path, columns=columns).to_pylist()
    wanted = set(cfg.episodes) if cfg.episodes is not None else None
    kept = [r for r in rows if wanted is None or int(r["episode_index"]) in wanted]
    if cfg.successful_only:
        kept = [r for r in kept if bool(r["success"])]
        if not kept:
            raise DatasetMismatchError("successful_only", "data.successful_only: no selected episode has success == True",
                                       "set successful_only=false or select episodes that succeeded")
    span = max(cfg.num_frames, cfg.chunk_length)
    lengths = [int(r["length"]) for r in kept]
    samples = sum(max(0, n - span + 1) for n in lengths) if cfg.complete_chunks_only else sum(lengths)
    if samples == 0:
        raise DatasetMismatchError(
            "complete_chunks_only",
            f"no training sample: with complete_chunks_only every episode needs at least {span} frames "
            f"(the selected episodes have at most {max(lengths, default=0)})",
            "set complete_chunks_only=false (padded windows, masked) or use longer episodes",
        )
    return samples


def episode_metadata_columns(root: Path) -> list[str]:
    """Column names of the dataset's ``meta/episodes`` parquet files (their schema only)."""
    import pyarrow.parquet as pq

    files = sorted((root / "meta" / "episodes").rglob("*.parquet"))
    if not files:
        raise DatasetMismatchError(
            "root", f"LeRobot dataset at '{root}' has no meta/episodes parquet file",
            "point the dataset root at a complete LeRobot v3 dataset",
        )
    return list(pq.read_schema(files[0]).names)


def _camera_features(features: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted(k for k, spec in features.items() if spec.get("dtype") in CAMERA_DTYPES)


def _check_vector(features: Mapping[str, Mapping[str, Any]], key: str, width: int, what: str) -> None:
    spec = features[key]
    fix = f"use a LIBERO dataset whose '{key}' is float32 [{width}] (as toolkits/libero/record_demos.py writes)"
    shape = tuple(spec.get("shape", ()))
    if shape != (width,):
        raise DatasetMismatchError(
            "root", f"{what}: feature '{key}' has shape {list(shape)}, expected [{width}]", fix
        )
    dtype = spec.get("dtype")
    if dtype not in VECTOR_DTYPES:
        raise DatasetMismatchError("root", f"feature '{key}' has dtype '{dtype}', expected float32", fix)


def _check_image(
    features: Mapping[str, Mapping[str, Any]], key: str, image_size: Sequence[int], cameras: Sequence[str]
) -> None:
    spec = features[key]
    dtype = spec.get("dtype")
    if dtype not in CAMERA_DTYPES:
        raise DatasetMismatchError(
            "image_keys",
            f"feature '{key}' has dtype '{dtype}', expected a camera stored as {' or '.join(CAMERA_DTYPES)}",
            f"list only camera features in image_keys (this dataset's: {list(cameras)}), or re-record the "
            "dataset with its cameras stored as video or image",
        )
    info = spec.get("info") or {}
    if info.get("is_depth_map") or info.get("video.is_depth_map"):
        raise DatasetMismatchError(
            "image_keys", f"feature '{key}' is a depth map, the model takes RGB cameras",
            f"list only RGB camera features in image_keys (this dataset's cameras: {list(cameras)})",
        )
    shape = list(spec.get("shape", ()))
    names = list(spec.get("names") or [])
    if len(shape) != 3:
        raise DatasetMismatchError(
            "image_keys", f"image feature '{key}' has shape {shape}, expected 3 dimensions",
            "list only RGB camera features in image_keys",
        )
    if names[:1] and str(names[0]).startswith("channel"):
        channels, height, width = shape
    else:
        height, width, channels = shape
    if channels != 3:
        raise DatasetMismatchError(
            "image_keys", f"image feature '{key}' has {channels} channels, expected 3 (RGB)",
            "list only RGB camera features in image_keys",
        )
    expected_h, expected_w = image_size
    if (height, width) != (expected_h, expected_w):
        raise DatasetMismatchError(
            "image_size",
            f"image size mismatch: feature '{key}' is {height}x{width}x{channels} (HxWxC), "
            f"data.image_size expects {expected_h}x{expected_w}x3",
            f"set image_size=[{height}, {width}] if the model was trained at that size, or use a dataset "
            f"stored at {expected_h}x{expected_w} (the reader does not resize)",
        )
