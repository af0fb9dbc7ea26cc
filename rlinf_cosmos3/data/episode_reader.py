"""Every training sample of one episode, with each stored camera frame decoded once.

The reader (``rlinf_cosmos3.data.dataset.LiberoLeRobotDataset``) gives one sample per frame ``t``, each
with its own ``num_frames`` window, so reading all of an episode's samples decodes every stored frame about
``num_frames`` times (AV1 with a keyframe every 2 frames: each window also decodes from the keyframe before
it). Building a latent cache reads every sample once; this module reads each episode once instead: its
frames decoded by lerobot's own ``decode_video_frames`` (or, for ``image`` features, its PNG cells), and each
sample's window given as row numbers into them. Windows, padding and the non-pixel fields follow the
reader's rule (lerobot's: the query is clamped to the episode, frames and actions past its end are padding)
and are the reader's values exactly (tested sample by sample against it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.video_utils import decode_video_frames

from rlinf_cosmos3.config.data import ACTION_KEY, STATE_KEY, LiberoDataConfig, image_output_name
from rlinf_cosmos3.data.frame_windows import clamp_to_episode, row_lookup
from rlinf_cosmos3.data.image_frames import decode_png_column

ActionsFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""The reader's 7-D action window -> (normalised 10-D actions, idle-step count)."""

_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index", ACTION_KEY, STATE_KEY)


@dataclass
class EpisodeSamples:
    """One episode's samples: ``frames[name][windows[i]]`` is sample i's camera ``name`` window."""

    episode: int
    positions: np.ndarray
    """int64 ``[n]``: each sample's position in the reader (``reader[positions[i]]``)."""
    frames: dict[str, torch.Tensor]
    """Output name (the reader's sample key) -> uint8 ``[episode length, 3, H, W]``, the frames in order."""
    windows: torch.Tensor
    """int64 ``[n, num_frames]``: the rows of ``frames`` that make each sample's window."""
    samples: list[dict[str, Any]]
    """Each sample's other fields (actions, masks, state, prompt, indexes), as the reader gives them."""

    def sample(self, i: int) -> dict[str, Any]:
        """Sample ``i`` whole, pixels included: what ``reader[positions[i]]`` returns."""
        return {**{name: frames[self.windows[i]] for name, frames in self.frames.items()}, **self.samples[i]}


class EpisodeReader:
    """The reader's samples episode by episode (its frame table read once here).

    ``dataset``, ``cfg``, ``rows`` (the samples' rows of the frame table; ``None``: every row), ``video_backend``
    and ``actions`` are the reader's own (``LiberoLeRobotDataset`` makes this object).
    """

    def __init__(self, dataset: LeRobotDataset, cfg: LiberoDataConfig, rows: np.ndarray | None,
                 video_backend: str, actions: ActionsFn) -> None:
        self.cfg, self._actions_10 = cfg, actions
        self._meta, self._root, self._tolerance = dataset.meta, Path(dataset.root), dataset.tolerance_s
        self._video_backend = video_backend
        table = dataset.hf_dataset.with_format("arrow", columns=list(_COLUMNS))[:]
        self._columns = {name: table.column(name).to_numpy(zero_copy_only=False) for name in _COLUMNS[:5]}
        self._actions = np.stack(table.column(ACTION_KEY).to_numpy(zero_copy_only=False)).astype(np.float32)
        self._state = np.stack(table.column(STATE_KEY).to_numpy(zero_copy_only=False)).astype(np.float32)
        self._row_of = row_lookup(self._columns["index"])  # absolute index -> table row
        sample_rows = rows if rows is not None else np.arange(len(self._columns["index"]))
        episode_of_sample = self._columns["episode_index"][sample_rows].astype(np.int64)
        self._sample_rows = sample_rows
        self._positions = {int(ep): np.flatnonzero(episode_of_sample == ep) for ep in np.unique(episode_of_sample)}
        self._image_cells = (
            dataset.hf_dataset.with_format("arrow", columns=[k for k in cfg.image_keys if k in self._meta.image_keys])
            if any(k in self._meta.image_keys for k in cfg.image_keys) else None
        )

    def episodes(self) -> list[int]:
        """Episodes with at least one sample, in order."""
        return sorted(self._positions)

    def positions(self, episode: int) -> np.ndarray:
        """The reader positions of ``episode``'s samples (nothing decoded)."""
        return self._positions[episode]

    def read(self, episode: int) -> EpisodeSamples:
        cfg, meta = self.cfg, self._meta
        ep = meta.episodes[episode]
        start, end = int(ep["dataset_from_index"]), int(ep["dataset_to_index"])
        episode_rows = self._row_of[start:end]
        if (episode_rows < 0).any():
            raise IndexError(f"episode {episode}: frames {start}..{end - 1} are not all among the loaded rows")
        frames = {image_output_name(key): self._camera_frames(key, ep, episode, episode_rows)
                  for key in cfg.image_keys}
        positions = self._positions[episode]
        rows = self._sample_rows[positions]
        absolute = self._columns["index"][rows].astype(np.int64)
        frame_query = absolute[:, None] + np.arange(cfg.num_frames)
        action_query = absolute[:, None] + np.arange(cfg.chunk_length)
        frame_rows, frame_is_pad = clamp_to_episode(frame_query, start, end)
        action_rows, action_is_pad = clamp_to_episode(action_query, start, end)
        windows = torch.from_numpy(frame_rows - start)
        samples = []
        for i, row in enumerate(rows):
            actions, idle = self._actions_10(torch.from_numpy(self._actions[self._row_of[action_rows[i]]]))
            samples.append({
                "frame_is_pad": torch.from_numpy(frame_is_pad[i]),
                "actions": actions,
                "idle_frames": idle,
                "action_is_pad": torch.from_numpy(action_is_pad[i]),
                "state": torch.from_numpy(self._state[row]),
                "prompt": meta.tasks.iloc[int(self._columns["task_index"][row])].name,
                **{key: torch.tensor(int(self._columns[key][row]), dtype=torch.int64)
                   for key in ("episode_index", "frame_index", "index")},
            })
        return EpisodeSamples(episode, positions.astype(np.int64), frames, windows, samples)

    def _camera_frames(self, key: str, ep: dict[str, Any], episode: int, rows: np.ndarray) -> torch.Tensor:
        """All of the episode's frames of camera ``key``, uint8 ``[T, 3, H, W]``, decoded once each."""
        if key in self._meta.image_keys:
            assert self._image_cells is not None
            return decode_png_column(self._image_cells[rows.tolist()].column(key).to_pylist(), key)
        # the reader's timestamps: the rows' float32 timestamps, shifted into the episode's video file
        timestamps = torch.from_numpy(self._columns["timestamp"][rows]).tolist()
        shift = ep[f"videos/{key}/from_timestamp"]
        path = self._root / self._meta.get_video_file_path(episode, key)
        frames = decode_video_frames(path, [shift + ts for ts in timestamps], self._tolerance, self._video_backend,
                                     return_uint8=True)
        if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[0] != len(rows):
            raise TypeError(f"camera '{key}', episode {episode}: decoded {tuple(frames.shape)} {frames.dtype}, "
                            f"expected uint8 [{len(rows)}, 3, H, W]")
        return frames
