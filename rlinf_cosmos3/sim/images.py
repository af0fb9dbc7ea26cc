"""Image orientation shared by the simulator bridge and the demonstration recorder.

numpy only: the simulator process imports this module too.
"""

from __future__ import annotations

import numpy as np


def rotate_180(image: np.ndarray) -> np.ndarray:
    """LIBERO renders upside down (OpenGL origin at the bottom left); LIBERO's datasets store
    every camera image rotated by 180°, so every image leaving the simulator goes through here.

    Works on a single ``[H, W, C]`` image or a stack ``[..., H, W, C]``; returns a contiguous copy.
    """
    if image.ndim < 3:
        raise ValueError(f"rotate_180 expects [..., H, W, C], got shape {image.shape}")
    return np.ascontiguousarray(image[..., ::-1, ::-1, :])
