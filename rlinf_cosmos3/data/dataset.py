"""LIBERO training samples from a local LeRobot v3 dataset.

lerobot's :class:`LeRobotDataset` does the reading (parquet rows, ``delta_timestamps`` windows,
video decoding with PyAV); this module only checks the dataset against the config, asks for the
right windows, and turns the 7-D actions into the normalised 10-D actions the model learns.

Cameras may be stored as ``video`` (MP4, decoded by lerobot, uint8 with ``return_uint8``) or as
``image`` (PNG frames in the parquet rows, as ``LeRobotDataset.create(..., use_videos=False)``
writes them; read by :class:`ImageFeatureWindows` straight to uint8, since lerobot's own path
returns float32 ``k / 255`` and decodes every image column of every queried row). Either way the
sample holds the stored uint8 pixels, so both layouts give the model the same input.

Sample at frame ``t`` of an episode of ``T`` frames (defaults: 17 frames, 16 actions)::

    <camera>        uint8 [num_frames, 3, H, W]  RGB, channels first, frames t .. t+num_frames-1
                    (the diffusers video layout; divide by 255 for [0, 1]); video or image features
    frame_is_pad    bool  [num_frames]           True where t+k >= T
    actions         float32 [chunk_length, 10]   actions t .. t+chunk_length-1 as
                    [dpos(3), rot6d(6), gripper(1)], normalised (quantile_rot, global_raw stats)
    action_is_pad   bool  [chunk_length]         True where t+k >= T
    state           float32 [8]                  observation.state at t (not normalised)
    idle_frames     int64                        idle steps of the chunk, counted on the raw 10-D
                                                 actions as NVIDIA's captions count them
                                                 (``rlinf_cosmos3.actions.count_idle_frames``)
    prompt          str                          the episode's task
    episode_index, frame_index, index   int64    episode, frame within episode, dataset row

Past the episode end lerobot clamps the query to the last frame, so padded frames repeat the
episode's last frame and padded actions repeat its last action (converted and normalised like
any other). This is also what NVIDIA's cosmos-policy LIBERO loader does
(``get_action_chunk_with_padding``); losses should still use the masks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from rlinf_cosmos3.actions import ActionNormalizer, ActionStatsError, count_idle_frames, encode_model_actions
from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.config.data import ACTION_KEY, STATE_KEY, LiberoDataConfig, image_output_name
from rlinf_cosmos3.data.checks import DatasetMismatchError, check_dataset_info
from rlinf_cosmos3.data.episode_reader import EpisodeReader, EpisodeSamples
from rlinf_cosmos3.data.image_frames import ImageFeatureWindows

logger = logging.getLogger(__name__)

VIDEO_BACKEND = "pyav"  # torchcodec fails inside DataLoader workers on these machines


class LiberoLeRobotDataset(torch.utils.data.Dataset):
    """Map-style dataset of LIBERO training samples; one sample per kept frame ``t``."""

    def __init__(self, cfg: LiberoDataConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        root = Path(cfg.root).expanduser()
        check_dataset_info(cfg)  # the SFT driver ran these too; a reader opened on its own needs them
        meta = LeRobotDatasetMetadata(cfg.repo_id, root=root)
        self.normalizer = _load_normalizer(cfg)
        episodes = _select_episodes(meta, cfg)
        _check_video_files(meta, root, episodes, cfg.image_keys)

        self._image_names = {key: image_output_name(key) for key in cfg.image_keys}
        image_features = [key for key in cfg.image_keys if key in meta.image_keys]  # the rest are videos
        self._dataset = LeRobotDataset(
            cfg.repo_id,
            root=root,
            episodes=episodes,
            delta_timestamps=_delta_timestamps(cfg, [k for k in cfg.image_keys if k not in image_features]),
            video_backend=VIDEO_BACKEND,
            return_uint8=True,
        )
        self._image_windows = (
            ImageFeatureWindows(self._dataset, image_features, cfg.num_frames) if image_features else None
        )
        self.episodes = episodes if episodes is not None else list(range(meta.total_episodes))
        self._rows = _complete_chunk_rows(self._dataset, meta, cfg) if cfg.complete_chunks_only else None
        self._episode_reader: EpisodeReader | None = None
        if len(self) == 0:
            raise DatasetMismatchError(
                "complete_chunks_only",
                f"no training sample: with complete_chunks_only every episode needs at least "
                f"{max(cfg.num_frames, cfg.chunk_length)} frames",
                "set complete_chunks_only=false (padded windows, masked) or use longer episodes",
            )
        logger.info(
            "LIBERO dataset %s: %d episodes, %d samples (fps %d, %d frames, %d actions)",
            root,
            len(self.episodes),
            len(self),
            cfg.fps,
            cfg.num_frames,
            cfg.chunk_length,
        )

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else len(self._dataset)

    def episode_indexes(self) -> np.ndarray:
        """The episode of every sample, in sample order, read from the frame table (no video is decoded):
        for tools that pick samples per episode, where ``self[i]["episode_index"]`` would decode every frame."""
        episode = self._dataset.hf_dataset.data.column("episode_index").to_numpy()
        return episode[self._rows] if self._rows is not None else episode

    @property
    def lerobot_dataset(self) -> LeRobotDataset:
        """lerobot's dataset underneath (its metadata, root and frame table)."""
        return self._dataset

    def sample_episodes(self) -> list[int]:
        """The episodes that have samples, in order (nothing decoded)."""
        return self._episodes().episodes()

    def episode_positions(self, episode: int) -> np.ndarray:
        """The positions of ``episode``'s samples in this reader (nothing decoded)."""
        return self._episodes().positions(episode)

    def read_episode(self, episode: int) -> EpisodeSamples:
        """All of ``episode``'s samples, each camera frame decoded once (:mod:`~rlinf_cosmos3.data.episode_reader`):
        for work that reads every sample, e.g. a latent cache build, where sample by sample decodes each frame
        ``num_frames`` times."""
        return self._episodes().read(episode)

    def _episodes(self) -> EpisodeReader:
        if self._episode_reader is None:
            self._episode_reader = EpisodeReader(self._dataset, self.cfg, self._rows, VIDEO_BACKEND, self.actions_10)
        return self._episode_reader

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {len(self)} samples")
        item = self._dataset[int(self._rows[idx]) if self._rows is not None else idx]
        if self._image_windows is not None:
            frames, is_pad = self._image_windows(int(item["index"]), int(item["episode_index"]))
            item.update(frames)
            item.update({f"{key}_is_pad": is_pad for key in frames})
        sample: dict[str, Any] = {name: _uint8(item[key], key) for key, name in self._image_names.items()}
        sample["frame_is_pad"] = item[f"{self.cfg.image_keys[0]}_is_pad"]
        sample["actions"], sample["idle_frames"] = self.actions_10(item[ACTION_KEY])
        sample["action_is_pad"] = item[f"{ACTION_KEY}_is_pad"]
        sample["state"] = item[STATE_KEY].to(torch.float32)
        sample["prompt"] = item["task"]
        for key in ("episode_index", "frame_index", "index"):
            sample[key] = item[key].to(torch.int64)
        return sample

    def actions_10(self, actions_7: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """7-D stored actions -> normalised 10-D float32 (maths in float64 inside the helpers) and the
        chunk's idle-step count (on the raw 10-D actions, padded steps included)."""
        normalized, a10 = encode_model_actions(actions_7.numpy(), self.normalizer)
        idle = torch.tensor(count_idle_frames(a10, self.cfg.fps), dtype=torch.int64)
        return torch.from_numpy(normalized), idle


def _uint8(frames: torch.Tensor, key: str) -> torch.Tensor:
    """Guard: the model takes uint8 frames; fail here, naming the camera, if lerobot changes that."""
    if frames.dtype != torch.uint8:
        raise TypeError(f"camera '{key}': frames of dtype {frames.dtype}, expected uint8")
    return frames


def _load_normalizer(cfg: LiberoDataConfig) -> ActionNormalizer:
    """Read the stats file; a missing/malformed file or one made for another recipe is a config error."""
    try:
        normalizer = ActionNormalizer(cfg.stats_path, method=cfg.normalization)
    except FileNotFoundError as err:
        raise ConfigError("data.stats_path", f"action stats file not found at '{cfg.stats_path}'") from err
    except ActionStatsError as err:
        raise ConfigError("data.stats_path", f"malformed action stats file: {err}") from err
    # Fields the stats writer records about how the stats were made; checked only when present
    # (NVIDIA's bundled file need not carry them).
    recorded = {"fps": cfg.fps, "chunk_length": cfg.chunk_length, "normalization": cfg.normalization,
                "gripper_convention": cfg.gripper_convention}
    for field, expected in recorded.items():
        value = normalizer.metadata.get(field)
        if value is not None and value != expected:
            raise ConfigError(
                f"data.{field}",
                f"is {expected!r} but the action stats '{cfg.stats_path}' were made with {field}={value!r}",
                "use stats computed for this setting or change the setting",
            )
    return normalizer


def _delta_timestamps(cfg: LiberoDataConfig, video_keys: list[str]) -> dict[str, list[float]]:
    """Windows lerobot cuts: the action chunk and the video cameras (image features: ImageFeatureWindows)."""
    frames = [k / cfg.fps for k in range(cfg.num_frames)]
    deltas = {key: list(frames) for key in video_keys}
    deltas[ACTION_KEY] = [k / cfg.fps for k in range(cfg.chunk_length)]
    return deltas


def _select_episodes(meta: LeRobotDatasetMetadata, cfg: LiberoDataConfig) -> list[int] | None:
    """Episode subset after the optional success filter; ``None`` means every episode."""
    if not cfg.successful_only:
        return sorted(set(cfg.episodes)) if cfg.episodes is not None else None
    candidates = set(cfg.episodes) if cfg.episodes is not None else None
    rows = meta.episodes.select_columns(["episode_index", "success"])
    kept = sorted(
        int(ep)
        for ep, ok in zip(rows["episode_index"], rows["success"], strict=True)
        if bool(ok) and (candidates is None or int(ep) in candidates)
    )
    if not kept:
        raise DatasetMismatchError(
            "successful_only",
            "data.successful_only: no selected episode has success == True",
            "set successful_only=false or select episodes that succeeded",
        )
    return kept


def _complete_chunk_rows(
    dataset: LeRobotDataset, meta: LeRobotDatasetMetadata, cfg: LiberoDataConfig
) -> np.ndarray:
    """Rows whose window t .. t+max(num_frames, chunk_length)-1 stays inside the episode."""
    lengths = dict(zip(meta.episodes["episode_index"], meta.episodes["length"], strict=True))
    table = dataset.hf_dataset.data
    episode = table.column("episode_index").to_numpy()
    frame = table.column("frame_index").to_numpy()
    length = np.array([lengths[int(e)] for e in episode], dtype=np.int64)
    span = max(cfg.num_frames, cfg.chunk_length)
    return np.flatnonzero(frame + span <= length)


def _check_video_files(
    meta: LeRobotDatasetMetadata, root: Path, episodes: list[int] | None, image_keys: list[str]
) -> None:
    """Fail on a missing video file here, since lerobot would try to download it from the hub."""
    for ep in episodes if episodes is not None else range(meta.total_episodes):
        for key in image_keys:
            if key not in meta.video_keys:
                continue
            path = root / meta.get_video_file_path(ep, key)
            if not path.is_file():
                raise DatasetMismatchError(
                    "root",
                    f"video file of episode {ep}, camera '{key}' is missing: '{path}'",
                    "copy the dataset's videos/ folder completely",
                )
