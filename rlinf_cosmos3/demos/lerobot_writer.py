"""Writes recorded LIBERO demonstrations as a LeRobot v3.0 dataset with lerobot's own writer.

Layout matches NVIDIA's LIBERO LeRobot data: 20 fps, two 256x256 cameras rotated 180°
(``observation.images.image`` = agentview, ``observation.images.wrist_image``), stored as MP4
videos (``use_videos=True``, the default) or as lossless PNG image features in the parquet files
(``use_videos=False``, as many public LIBERO conversions are), an 8-D float32
``observation.state`` (eef pos, eef axis-angle, gripper qpos x2) and a 7-D float32 ``action``
(delta xyz, delta axis-angle as commanded, gripper g = (1 - a) / 2 with 1 = open).

Per-episode outcome: lerobot 0.6.1 has no public way to add fields to an episode's row of
``meta/episodes`` (``save_episode`` only takes frames; ``LeRobotDatasetMetadata.save_episode``
builds the row from lerobot's own fields). So after ``finalize()`` the extra columns in
:data:`EPISODE_FIELDS` are added to the ``meta/episodes`` parquet files, keyed by
``episode_index``; lerobot loads them like its own columns (``dataset.meta.episodes["success"]``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlinf_cosmos3.actions import libero_command_to_dataset_gripper
from rlinf_cosmos3.config.data import ACTION_KEY, MAIN_IMAGE_KEY, STATE_KEY, WRIST_IMAGE_KEY
from rlinf_cosmos3.config.libero_suites import ACTION_DIM, STATE_DIM
from rlinf_cosmos3.procgroup import keep_scheduling

logger = logging.getLogger(__name__)

FPS = 20
IMAGE_SIZE = 256
STATE_NAMES = ["eef_x", "eef_y", "eef_z", "eef_axis_angle_x", "eef_axis_angle_y", "eef_axis_angle_z",
               "gripper_qpos_left", "gripper_qpos_right"]
ACTION_NAMES = ["dx", "dy", "dz", "d_axis_angle_x", "d_axis_angle_y", "d_axis_angle_z", "gripper_open"]
# Extra per-episode columns of meta/episodes and their arrow types.
EPISODE_FIELDS: dict[str, pa.DataType] = {
    "success": pa.bool_(),  # check_success() at the last recorded frame
    "success_once": pa.bool_(),  # check_success() at any recorded step
    "suite": pa.string(),
    "task_id": pa.int64(),
    "init_state_id": pa.int64(),
    "num_settle_steps": pa.int64(),  # unrecorded no-op steps before frame 0
    "repeat": pa.int64(),  # which recording of this task and init state (0-based; record_demos --repeats)
}


def demo_features(image_size: int = IMAGE_SIZE, use_videos: bool = True) -> dict[str, dict[str, Any]]:
    """The lerobot feature spec of a demonstration dataset (cameras as ``video`` or ``image``)."""
    camera = {"dtype": "video" if use_videos else "image", "shape": (image_size, image_size, 3),
              "names": ["height", "width", "channel"]}
    return {
        MAIN_IMAGE_KEY: dict(camera),
        WRIST_IMAGE_KEY: dict(camera),
        STATE_KEY: {"dtype": "float32", "shape": (STATE_DIM,), "names": STATE_NAMES},
        ACTION_KEY: {"dtype": "float32", "shape": (ACTION_DIM,), "names": ACTION_NAMES},
    }


def command_to_stored_action(command: np.ndarray) -> np.ndarray:
    """LIBERO command (gripper -1 open / +1 close) -> stored action (gripper g in [0, 1], 1 = open)."""
    command = np.asarray(command, dtype=np.float32)
    if command.shape != (ACTION_DIM,):
        raise ValueError(f"expected a {ACTION_DIM}-D LIBERO command, got shape {command.shape}")
    stored = command.copy()
    stored[6] = libero_command_to_dataset_gripper(command[6])
    return stored


@dataclass
class EpisodeRecord:
    """Outcome of one recorded episode, stored in meta/episodes."""

    success: bool
    success_once: bool
    suite: str
    task_id: int
    init_state_id: int
    num_settle_steps: int
    repeat: int = 0


class DemoDatasetWriter:
    """Thin layer over ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``."""

    def __init__(self, root: str | Path, repo_id: str, fps: int = FPS, image_size: int = IMAGE_SIZE,
                 use_videos: bool = True) -> None:
        """``use_videos``: cameras as MP4 videos (True) or as PNG image features (False)."""
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self.root = Path(root)
        if self.root.exists() and any(self.root.iterdir()):
            raise FileExistsError(f"{self.root} exists and is not empty; choose a new --out")
        if self.root.exists():
            self.root.rmdir()  # lerobot creates the directory itself and refuses an existing one
        self.image_size = image_size
        self._dataset = LeRobotDataset.create(repo_id, fps=fps, features=demo_features(image_size, use_videos),
                                              root=self.root, use_videos=use_videos)
        self._records: dict[int, EpisodeRecord] = {}
        self._frames_in_episode = 0
        self._finalized = False

    @property
    def num_episodes(self) -> int:
        return len(self._records)

    def add_frame(self, main_image: np.ndarray, wrist_image: np.ndarray, state: np.ndarray,
                  command: np.ndarray, task: str) -> None:
        """One step: the observation *before* the command, and the command sent at it."""
        for name, img in (("main_image", main_image), ("wrist_image", wrist_image)):
            if img.shape != (self.image_size, self.image_size, 3) or img.dtype != np.uint8:
                raise ValueError(f"{name}: expected uint8 {self.image_size}x{self.image_size}x3, got "
                                 f"{img.dtype} {img.shape}")
        self._dataset.add_frame({
            MAIN_IMAGE_KEY: main_image,
            WRIST_IMAGE_KEY: wrist_image,
            STATE_KEY: np.asarray(state, dtype=np.float32),
            ACTION_KEY: command_to_stored_action(command),
            "task": task,
        })
        self._frames_in_episode += 1

    def save_episode(self, record: EpisodeRecord) -> int:
        """Write the buffered frames as one episode; returns its episode index."""
        if self._frames_in_episode == 0:
            raise ValueError("no frames to save")
        index = self._dataset.meta.total_episodes
        with keep_scheduling():  # SVT-AV1 as root would leave this process real-time (procgroup.py)
            self._dataset.save_episode(parallel_encoding=False)
        self._records[index] = record
        self._frames_in_episode = 0
        return index

    def discard_episode(self) -> None:
        """Drop the buffered frames (a failed episode that is not kept)."""
        self._dataset.clear_episode_buffer()
        self._frames_in_episode = 0

    def finalize(self) -> None:
        """Close lerobot's writers, then add the per-episode outcome columns. Idempotent."""
        if self._finalized:
            return
        if self._frames_in_episode:
            self.discard_episode()
        with keep_scheduling():
            self._dataset.finalize()
        self._finalized = True
        if self._records:
            add_episode_columns(self.root, {i: vars(r) for i, r in self._records.items()})


def add_episode_columns(root: Path, values: dict[int, dict[str, Any]]) -> None:
    """Add the :data:`EPISODE_FIELDS` columns to every ``meta/episodes`` parquet file of ``root``."""
    files = sorted((root / "meta" / "episodes").rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no meta/episodes parquet files under {root}")
    seen = set()
    for path in files:
        table = pq.read_table(path)
        indices = table.column("episode_index").to_pylist()
        missing = [i for i in indices if i not in values]
        if missing:
            raise KeyError(f"{path}: no recorded outcome for episodes {missing}")
        for name, arrow_type in EPISODE_FIELDS.items():
            column = pa.array([values[i][name] for i in indices], type=arrow_type)
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, column)
            else:
                table = table.append_column(name, column)
        pq.write_table(table, path)
        seen.update(indices)
    if seen != set(values):
        raise KeyError(f"episodes {sorted(set(values) - seen)} are missing from meta/episodes")
