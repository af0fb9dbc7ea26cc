"""Idle frames of an action chunk: how many steps the robot stands still, as NVIDIA's captions count them.

NVIDIA's LIBERO training caption carries ``"idle_frame": "N out of 16."`` (the model learns when a
chunk is a pause). cosmos-framework counts N on the raw (un-normalised) 10-D chunk
(``ActionBaseDataset._compute_idle_frames`` -> ``pose_utils.compute_idle_frames``); this module
counts it by the same rule:

* a step is *raw-idle* when all three hold: translation ``|dpos| < 5e-3 / fps``; rotation angle of
  ``[c0, c1, c0 x c1]`` (from ``trace = 1 + 2 cos(angle)``) ``< 1.5 deg / fps``; gripper change from
  the previous step ``< 1e-2`` (step 0 compares with itself, so its change is 0);
* only runs of at least 3 consecutive raw-idle steps count.

Thresholds are per second divided by the fps, in the stored units (so a ``pm_one`` gripper counts a
change of its ±1 value). Pure numpy: the simulator environment can import it too.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from rlinf_cosmos3.actions._arrays import as_float64

TRANSLATION_PER_S = 5e-3
"""Translation threshold per second (units of the stored action)."""
ROTATION_PER_S = math.radians(1.5)
"""Rotation threshold per second (radians)."""
GRIPPER_CHANGE = 1e-2
"""Largest gripper change between consecutive steps of an idle step."""
MIN_STREAK = 3
"""Shortest run of idle steps that counts."""


def _streak_mask(idle: np.ndarray, min_streak: int) -> np.ndarray:
    """Keep only runs of at least ``min_streak`` True values."""
    out = np.zeros_like(idle)
    start = None
    for i, value in enumerate(list(idle) + [False]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            if i - start >= min_streak:
                out[start:i] = True
            start = None
    return out


def idle_steps(actions10: ArrayLike, fps: float) -> np.ndarray:
    """``[T]`` bool: the steps of a ``[T, 10]`` un-normalised chunk that count as idle."""
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    a, _ = as_float64(actions10, 10, "idle_steps")
    if a.ndim != 2:
        raise ValueError(f"idle_steps: expected one chunk [T, 10], got shape {a.shape}")
    if len(a) == 0:
        return np.zeros(0, dtype=bool)
    c0, c1 = a[:, 3:6], a[:, 6:9]
    trace = c0[:, 0] + c1[:, 1] + (c0[:, 0] * c1[:, 1] - c0[:, 1] * c1[:, 0])  # R00 + R11 + (c0 x c1)_z
    angle = np.arccos(np.clip((trace - 1.0) / 2.0, -1.0, 1.0))
    gripper = a[:, 9]
    change = np.abs(np.diff(gripper, prepend=gripper[:1]))
    raw = (np.linalg.norm(a[:, 0:3], axis=1) < TRANSLATION_PER_S / fps) & (angle < ROTATION_PER_S / fps) \
        & (change < GRIPPER_CHANGE)
    return _streak_mask(raw, MIN_STREAK)


def count_idle_frames(actions10: ArrayLike, fps: float) -> int:
    """Number of idle steps of a ``[T, 10]`` un-normalised chunk (``N`` of ``"N out of T."``)."""
    return int(idle_steps(actions10, fps).sum())
