"""Action statistics: the stats JSON schema, reading/writing it, and computing it from episodes.

File layout (same as NVIDIA's bundled ``libero_native_frame_wise_relative_rot6d.json`` in
cosmos-framework ``cosmos_framework/data/generator/action/normalizer_stats/``)::

    {"metadata": {...},
     "global":     {"mean": [10], "std": [10], "min": [10], "max": [10], "q01": [10], "q99": [10]},
     "global_raw": {... same fields ...}}

``global_raw`` holds the real statistics of the 10-D actions; ``global`` is the same with the
rot6d channels 3..8 replaced by identity values (mean 0, std 1, min/q01 -1, max/q99 +1), so a plain
quantile normalisation leaves rotation untouched. ``quantile_rot`` normalisation reads
``global_raw`` (cosmos-framework ``LIBEROLeRobotDataset``: ``"global_raw" if
action_normalization == "quantile_rot" else "global"``).

How the numbers are computed follows NVIDIA's ``compute_action_stats.py`` (the script named in
cosmos-framework ``cosmos_framework/data/generator/action/datasets/cosmos3_action_lerobot.py`` as
``projects/cosmos3/vfm/datasets/action/compute_action_stats.py``; the public copy reads
``cosmos/data/vfm/action/compute_action_stats.py``) applied to cosmos-framework's
``LIBEROLeRobotDataset`` windows:

* a sample is one training chunk: ``chunk_length`` consecutive actions starting at frame t, for
  every t with the ``chunk_length + 1`` frames t..t+chunk_length inside the episode, i.e.
  ``T - chunk_length`` starts per episode of T frames (``_valid_cum`` in ``LIBEROLeRobotDataset``).
  So the last action of an episode never enters, and episodes of at most ``chunk_length`` frames
  contribute nothing;
* every action row of every sampled chunk is one observation (chunks overlap, so a frame counts
  once per chunk that contains it); mean, sample std (ddof=1, Welford in the reference), min, max
  and the 1% / 99% quantiles (``np.quantile``, linear interpolation) are taken per channel.

Our choices, documented in docs/action_conventions.md: by default all chunks are used and the
quantiles are exact over all rows (the reference draws 10 000 chunks with ``torch.randperm`` seeded
42 and estimates quantiles from a 50 000-row reservoir; ``max_samples``/``seed`` select a seeded
random subset of chunks with numpy instead). Overlap is handled with per-frame multiplicities,
which gives the same numbers as stacking all chunks without materialising them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cosmos3.actions.conversion import (
    ACTION_DIM_7,
    ACTION_DIM_10,
    GRIPPER_INDEX_7,
    GRIPPER_INDEX_10,
    ROT6D_SLICE_10,
    actions_7_to_10,
)
from rlinf_cosmos3.actions.gripper import GRIPPER_CONVENTIONS, GRIPPER_RANGES, gripper_range_problem

logger = logging.getLogger(__name__)

STATS_FILENAME = "libero_native_frame_wise_relative_rot6d.json"
STAT_FIELDS = ("mean", "std", "min", "max", "q01", "q99")
STATS_BLOCKS = ("global", "global_raw")
DEFAULT_CHUNK_LENGTH = 16
ROTATION_DIMS = tuple(range(ROT6D_SLICE_10.start, ROT6D_SLICE_10.stop))
# Values that make every normalisation method the identity on a channel (reference
# ``_apply_skip_rotation``).
_IDENTITY_STATS = {"mean": 0.0, "std": 1.0, "min": -1.0, "max": 1.0, "q01": -1.0, "q99": 1.0}


class ActionStatsError(ValueError):
    """A stats file or dict does not follow the schema; the message names the field and file."""


def validate_action_stats(stats: Any, source: str = "<stats dict>") -> dict[str, Any]:
    """Check the schema (metadata dict; global/global_raw blocks of 10 finite floats per field).

    Returns ``stats`` unchanged so callers can chain it. Raises ActionStatsError naming ``source``.
    """
    if not isinstance(stats, Mapping):
        raise ActionStatsError(f"{source}: action stats must be a JSON object, got {type(stats).__name__}")
    if "metadata" not in stats:
        raise ActionStatsError(f"{source}: missing top-level field 'metadata'")
    if not isinstance(stats["metadata"], Mapping):
        raise ActionStatsError(f"{source}: field 'metadata' must be an object")
    for block in STATS_BLOCKS:
        if block not in stats:
            raise ActionStatsError(f"{source}: missing top-level field '{block}'")
        if not isinstance(stats[block], Mapping):
            raise ActionStatsError(f"{source}: field '{block}' must be an object")
        for field in STAT_FIELDS:
            where = f"{source}: field '{block}.{field}'"
            if field not in stats[block]:
                raise ActionStatsError(f"{where} is missing")
            values = stats[block][field]
            if not isinstance(values, Sequence) or isinstance(values, str):
                raise ActionStatsError(f"{where} must be a list of {ACTION_DIM_10} numbers")
            if len(values) != ACTION_DIM_10:
                raise ActionStatsError(f"{where} has {len(values)} values, expected {ACTION_DIM_10}")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise ActionStatsError(f"{where} must hold finite numbers, found {v!r}")
    return dict(stats)


def load_action_stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a stats JSON file; errors name the file and the offending field."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"action stats file not found: {p}")
    try:
        stats = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ActionStatsError(f"{p}: not valid JSON ({exc})") from exc
    return validate_action_stats(stats, source=str(p))


def write_action_stats(stats: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate and write stats atomically (temp file in the same folder, then rename)."""
    p = Path(path)
    validate_action_stats(stats, source=str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(stats, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a stats file is meant to be shared
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def chunk_starts_per_episode(episode_lengths: Sequence[int], chunk_length: int) -> np.ndarray:
    """Number of training chunks per episode: ``max(0, T - chunk_length)`` (needs T+1 frames)."""
    lengths = np.asarray(episode_lengths, dtype=np.int64)
    return np.maximum(0, lengths - chunk_length)


def select_chunks(
    episode_lengths: Sequence[int], chunk_length: int, max_samples: int | None = None, seed: int = 0
) -> np.ndarray:
    """The chunks that enter the stats, as ``[n, 2]`` rows of (episode, start frame), sorted.

    All chunks, or a seeded uniform subset of ``max_samples`` of them drawn without replacement.
    """
    n_starts = chunk_starts_per_episode(episode_lengths, chunk_length)
    total = int(n_starts.sum())
    if max_samples is not None and max_samples < total:
        picked = np.sort(np.random.default_rng(seed).choice(total, size=max_samples, replace=False))
    else:
        picked = np.arange(total)
    offsets = np.concatenate([[0], np.cumsum(n_starts)])
    episode = np.searchsorted(offsets, picked, side="right") - 1
    return np.stack([episode, picked - offsets[episode]], axis=1).astype(np.int64).reshape(-1, 2)


def _frame_multiplicities(
    episode_lengths: Sequence[int], chunk_length: int, chunks: np.ndarray
) -> list[np.ndarray]:
    """How many of the selected chunks contain each frame, per episode."""
    weights = []
    bounds = np.searchsorted(chunks[:, 0], np.arange(len(episode_lengths) + 1))  # chunks sorted by episode
    for ep, length in enumerate(episode_lengths):
        starts = chunks[bounds[ep] : bounds[ep + 1], 1]
        diff = np.zeros(int(length) + 1, dtype=np.int64)
        np.add.at(diff, starts, 1)
        np.add.at(diff, starts + chunk_length, -1)
        weights.append(np.cumsum(diff)[: int(length)])
    return weights


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Linear interpolation written the way numpy's ``np.quantile(method="linear")`` does it."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1.0 - t), a + diff * t)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """``np.quantile(np.repeat(values, weights, axis=0), q, axis=0)`` without repeating.

    ``values`` ``[N, D]``, integer ``weights`` ``[N]`` (> 0). Exact "linear" method: the quantile
    sits at position ``q (n - 1)`` of the sorted expanded column.
    """
    n = int(weights.sum())
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    t = np.asarray(pos - lo)
    out = np.empty(values.shape[1], dtype=np.float64)
    for d in range(values.shape[1]):
        order = np.argsort(values[:, d], kind="stable")
        cum = np.cumsum(weights[order])
        col = values[order, d]
        a = col[np.searchsorted(cum, lo, side="right")]
        b = col[np.searchsorted(cum, hi, side="right")]
        out[d] = _lerp(np.asarray(a), np.asarray(b), t)
    return out


def _weighted_block(rows: np.ndarray, weights: np.ndarray) -> dict[str, list[float]]:
    n = int(weights.sum())
    w = weights.astype(np.float64)[:, None]
    mean = (rows * w).sum(axis=0) / n
    var = ((rows - mean) ** 2 * w).sum(axis=0) / (n - 1) if n > 1 else np.zeros(rows.shape[1])
    block = {
        "mean": mean,
        "std": np.sqrt(var),
        "min": rows.min(axis=0),
        "max": rows.max(axis=0),
        "q01": weighted_quantile(rows, weights, 0.01),
        "q99": weighted_quantile(rows, weights, 0.99),
    }
    return {k: [float(x) for x in block[k]] for k in STAT_FIELDS}


def rotation_passthrough(block: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """Copy of a stats block with the rot6d channels set to identity values (the ``global`` block)."""
    out = {k: [float(x) for x in block[k]] for k in STAT_FIELDS}
    for field, value in _IDENTITY_STATS.items():
        for d in ROTATION_DIMS:
            out[field][d] = value
    return out


def compute_action_stats(
    episodes: Sequence[np.ndarray],
    chunk_length: int = DEFAULT_CHUNK_LENGTH,
    max_samples: int | None = None,
    seed: int = 0,
    metadata: Mapping[str, Any] | None = None,
    gripper_convention: str = "zero_one",
) -> dict[str, Any]:
    """Stats of the 10-D actions over all training chunks of the given 7-D episodes.

    ``episodes``: one ``[T, 7]`` array per episode, gripper stored by ``gripper_convention``
    (``zero_one``: g in [0, 1], 1 = open; ``pm_one``/``pm_one_flip``: ±1, see
    :mod:`rlinf_cosmos3.actions.gripper`); values that cannot follow it are an error.
    ``max_samples``: use a seeded random subset of this many chunks (``seed``) instead of all.
    ``metadata``: extra fields (fps, dataset root, ...) merged into the file's metadata.
    """
    if gripper_convention not in GRIPPER_CONVENTIONS:
        raise ValueError(f"unknown gripper convention {gripper_convention!r}; use one of {list(GRIPPER_CONVENTIONS)}")
    if chunk_length < 1:
        raise ValueError(f"chunk_length must be >= 1, got {chunk_length}")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1 or None, got {max_samples}")
    arrays = []
    for i, ep in enumerate(episodes):
        arr = np.asarray(ep, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != ACTION_DIM_7:
            raise ValueError(f"episode {i}: expected actions of shape [T, {ACTION_DIM_7}], got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"episode {i}: actions contain NaN or inf")
        g = arr[:, GRIPPER_INDEX_7]
        low, high = GRIPPER_RANGES[gripper_convention]
        if g.size and (g.min() < low or g.max() > high):
            raise ValueError(
                f"episode {i}: gripper channel spans [{g.min()}, {g.max()}], outside [{low:g}, {high:g}] of the "
                f"gripper convention '{gripper_convention}'. For zero_one the stored value is g = (1 - command) / 2 "
                "(convert LIBERO -1/+1 commands with libero_command_to_dataset_gripper first); a dataset that "
                "stores -1/+1 is pm_one (robosuite's sign) or pm_one_flip"
            )
        arrays.append(arr)
    lengths = [a.shape[0] for a in arrays]
    n_chunks_all = int(chunk_starts_per_episode(lengths, chunk_length).sum())
    if n_chunks_all == 0:
        raise ValueError(
            f"no training chunk: every episode needs at least chunk_length + 1 = {chunk_length + 1} frames "
            f"(got {len(arrays)} episodes, longest {max(lengths, default=0)})"
        )
    chunks = select_chunks(lengths, chunk_length, max_samples, seed)
    w = np.concatenate(_frame_multiplicities(lengths, chunk_length, chunks))
    keep = w > 0
    rows = actions_7_to_10(np.concatenate(arrays, axis=0)[keep])
    w = w[keep]
    raw = _weighted_block(rows, w)
    problem = gripper_range_problem(raw["min"][GRIPPER_INDEX_10], raw["max"][GRIPPER_INDEX_10], gripper_convention)
    if problem is not None:
        raise ValueError(f"{problem}: set the gripper convention the dataset really uses")
    n_chunks = len(chunks)
    meta: dict[str, Any] = {
        "embodiment_type": "libero",
        "pose_convention": "frame_wise_relative",
        "pose_coordinate_frame": "native",
        "rotation_format": "rot6d",
        "action_dim": ACTION_DIM_10,
        "skip_rotation_dims": list(ROTATION_DIMS),
        "normalization": "quantile_rot",
        "gripper_convention": gripper_convention,
        "chunk_length": int(chunk_length),
        "sample_stride": 1,
        "num_episodes": len(arrays),
        "num_frames": int(sum(lengths)),
        "num_chunks_available": n_chunks_all,
        "num_chunks": n_chunks,
        "num_rows_stats": int(w.sum()),
        "max_samples": max_samples,
        "seed": int(seed),
        "quantile_method": "linear",
    }
    if metadata:
        meta.update(metadata)
    return {"metadata": meta, "global": rotation_passthrough(raw), "global_raw": raw}


@dataclass(frozen=True)
class EpisodeActions:
    """The ``action`` column of a LeRobot dataset split per episode, with what describes it."""

    episodes: list[np.ndarray]
    episode_indices: list[int]
    fps: int
    root: Path
    repo_id: str


def read_lerobot_episode_actions(root: str | os.PathLike[str], repo_id: str | None = None) -> EpisodeActions:
    """Read the 7-D ``action`` column of a local LeRobot v3 dataset, split per episode, in frame order.

    Uses lerobot's own reader (``LeRobotDataset(repo_id, root=root)``) on the parquet data only, so
    no video is decoded. Set ``HF_HUB_OFFLINE=1`` to make a missing file fail instead of downloading.
    """
    root_path = Path(root).resolve()
    if not (root_path / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"not a LeRobot dataset (no meta/info.json): {root_path}")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # heavy; main environment only

    rid = repo_id or f"local/{root_path.name}"
    ds = LeRobotDataset(rid, root=root_path, download_videos=False)
    feature = ds.features.get("action")
    if feature is None:
        raise ValueError(f"{root_path}: dataset has no 'action' feature (features: {sorted(ds.features)})")
    if tuple(feature["shape"]) != (ACTION_DIM_7,):
        raise ValueError(f"{root_path}: 'action' has shape {tuple(feature['shape'])}, expected ({ACTION_DIM_7},)")
    table = ds.hf_dataset.select_columns(["index", "episode_index", "action"]).with_format("numpy")
    index = np.asarray(table["index"], dtype=np.int64)
    episode = np.asarray(table["episode_index"], dtype=np.int64)
    actions = np.stack(table["action"]).astype(np.float32) if len(index) else np.zeros((0, ACTION_DIM_7))
    order = np.lexsort((index, episode))
    episode, actions = episode[order], actions[order]
    ep_ids, starts = np.unique(episode, return_index=True)
    bounds = list(starts[1:]) + [len(episode)]
    episodes = [actions[s:e] for s, e in zip(starts, bounds, strict=True)]
    logger.debug("read %d episodes, %d frames from %s", len(episodes), len(episode), root_path)
    return EpisodeActions(
        episodes=episodes,
        episode_indices=[int(i) for i in ep_ids],
        fps=int(ds.fps),
        root=root_path,
        repo_id=rid,
    )
