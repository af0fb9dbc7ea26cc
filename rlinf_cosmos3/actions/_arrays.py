"""Small array helpers shared by the action modules (dtype policy, shape checks)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def as_float64(x: ArrayLike, last_dim: int | tuple[int, ...], name: str) -> tuple[np.ndarray, np.dtype]:
    """Return ``x`` as float64 plus the dtype results should come back in.

    Maths runs in float64 so float32 inputs lose nothing in intermediate steps; the
    caller's floating dtype is restored on output (non-float inputs give float64).
    """
    arr = np.asarray(x)
    out_dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.dtype(np.float64)
    tail = (last_dim,) if isinstance(last_dim, int) else tuple(last_dim)
    if arr.ndim < len(tail) or arr.shape[arr.ndim - len(tail) :] != tail:
        raise ValueError(f"{name}: expected trailing shape {tail}, got array of shape {arr.shape}")
    return arr.astype(np.float64, copy=False), out_dtype
