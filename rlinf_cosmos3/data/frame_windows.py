"""lerobot's window rule over one episode, shared by the sample reader's image-feature windows and the
episode reader: a query of absolute frame indexes is clamped to the episode, and what lies outside it is
padding. Also the map from the dataset's absolute ``index`` column to rows of the loaded table."""

from __future__ import annotations

import numpy as np


def row_lookup(index: np.ndarray) -> np.ndarray:
    """int64 array ``a`` with ``a[index[r]] == r`` for every loaded row ``r``, ``-1`` for indexes not loaded."""
    index = np.asarray(index, dtype=np.int64)
    row_of = np.full(int(index.max()) + 1, -1, dtype=np.int64)
    row_of[index] = np.arange(len(index))
    return row_of


def clamp_to_episode(query: np.ndarray, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """``query`` (absolute indexes, any shape) clamped to the episode's ``[start, end)``, and where it was
    outside (lerobot's ``*_is_pad``)."""
    return np.clip(query, start, end - 1), (query < start) | (query >= end)
