"""Reader samples that carry the policy's canvas, composed where the sample is read.

The ``[main | wrist]`` canvas (:func:`~rlinf_cosmos3.models.cosmos3.observation.compose_observation`:
bicubic, antialiased) is costly per sample. Composed in the training process, one sample after another,
it would bound the latent-cache build and training from pixels well below what the loader's workers
deliver (``benchmarks/latent_cache_build.py``; figures in docs/benchmarks.md, "where the latent cache's
build time goes"). Wrapping the reader with :class:`CanvasSamples` moves it into the DataLoader's
workers, in parallel, and each sample then crosses the process boundary as one canvas instead of two
camera views (less than half the bytes).
The pixels are the same: the same function on the same frames (checked by the tests).

:class:`CanvasEpisodes` does the same for whole episodes (the reader's ``read_episode``): each frame is decoded
and composed once, and each sample's canvas window is rows of the episode's canvas frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import Dataset

from rlinf_cosmos3.data.dataset import LiberoLeRobotDataset
from rlinf_cosmos3.data.episode_reader import EpisodeSamples
from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig
from rlinf_cosmos3.models.cosmos3.observation import compose_observation
from rlinf_cosmos3.models.cosmos3.processor import CANVAS_KEY


class CanvasSamples(Dataset):
    """``reader[i]`` with its two camera views replaced by their canvas (``CANVAS_KEY``, uint8 ``[T, 3, H, W]``)."""

    def __init__(self, reader: Dataset, cfg: PolicyConfig) -> None:
        self.reader = reader
        self.cfg = cfg

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = dict(self.reader[index])
        cfg = self.cfg
        main, wrist = sample.pop(cfg.main_image_key), sample.pop(cfg.wrist_image_key)
        sample[CANVAS_KEY] = compose_observation(main, wrist, height=cfg.canvas_height, width=cfg.canvas_width)
        return sample


class CanvasEpisodes(Dataset):
    """``reader.read_episode(e)`` of the reader's episodes, the two camera views of every frame composed once
    into the canvas (``frames == {CANVAS_KEY: uint8 [T, 3, H, W]}``); item ``i`` is the ``i``-th episode."""

    def __init__(self, reader: LiberoLeRobotDataset, cfg: PolicyConfig) -> None:
        self.reader = reader
        self.cfg = cfg
        self.episodes = reader.sample_episodes()

    def __len__(self) -> int:
        return len(self.episodes)

    def positions(self, i: int) -> np.ndarray:
        """Reader positions of item ``i``'s samples (nothing decoded)."""
        return self.reader.episode_positions(self.episodes[i])

    def __getitem__(self, i: int) -> EpisodeSamples:
        episode = self.reader.read_episode(self.episodes[i])
        cfg = self.cfg
        main, wrist = episode.frames.pop(cfg.main_image_key), episode.frames.pop(cfg.wrist_image_key)
        episode.frames[CANVAS_KEY] = compose_observation(main, wrist, height=cfg.canvas_height,
                                                         width=cfg.canvas_width)
        return episode
