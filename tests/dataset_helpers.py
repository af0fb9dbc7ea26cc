"""Small real LeRobot v3 datasets in the LIBERO layout, written with lerobot's own writer.

For tests that need one property of a dataset right or wrong (camera storage, image size, a
missing feature); the content is random but valid (uint8 frames, float32 state and action).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

SHORT_FRAMES = 20
"""Frames of each episode of the ``short_libero_recording`` fixture (conftest.py)."""

MAIN, WRIST = "observation.images.image", "observation.images.wrist_image"
STATE, ACTION = "observation.state", "action"


def write_libero_like(
    root: Path,
    *,
    cameras: Mapping[str, str] | None = None,
    image_size: tuple[int, int] = (256, 256),
    fps: int = 20,
    action_dim: int | None = 7,
    state_dim: int = 8,
    length: int = 3,
    seed: int = 0,
) -> Path:
    """One episode of ``length`` frames at ``root``; returns ``root``.

    ``cameras`` maps a camera key to how lerobot stores it: ``"video"``, ``"image"``, or a numeric
    dtype such as ``"uint8"`` (a plain array feature, i.e. not a camera to lerobot). Default: both
    LIBERO cameras as images. ``action_dim=None`` writes no ``action`` feature.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from rlinf_cosmos3.procgroup import keep_scheduling

    cameras = dict(cameras) if cameras is not None else {MAIN: "image", WRIST: "image"}
    height, width = image_size
    features: dict[str, dict] = {
        key: {"dtype": dtype, "shape": (height, width, 3), "names": ["height", "width", "channel"]}
        for key, dtype in cameras.items()
    }
    features[STATE] = {"dtype": "float32", "shape": (state_dim,), "names": None}
    if action_dim is not None:
        features[ACTION] = {"dtype": "float32", "shape": (action_dim,), "names": None}
    use_videos = "video" in cameras.values()
    ds = LeRobotDataset.create("test/libero_like", fps=fps, features=features, root=root, use_videos=use_videos)
    rng = np.random.default_rng(seed)
    for _ in range(length):
        frame: dict = {key: rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for key in cameras}
        frame[STATE] = rng.normal(size=state_dim).astype(np.float32)
        if action_dim is not None:
            frame[ACTION] = rng.uniform(-0.5, 0.5, size=action_dim).astype(np.float32)
        frame["task"] = "pick up the black bowl"
        ds.add_frame(frame)
    with keep_scheduling():  # SVT-AV1 as root would leave this process real-time
        ds.save_episode(parallel_encoding=False)
        ds.finalize()
    return root
