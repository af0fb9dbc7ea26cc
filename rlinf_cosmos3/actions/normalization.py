"""``quantile_rot`` action normalisation: the map between 10-D actions and the model's [-1, 1] range.

``a_n = 2 (a - q01) / max(q99 - q01, 1e-8) - 1`` with q01/q99 from the stats file's
``global_raw`` block (so the rot6d channels are normalised too, unlike plain ``quantile`` on
``global``). Formula as in cosmos-framework
``cosmos_framework/data/generator/action/action_normalization.py::normalize_action``; the inverse
uses the same floored range (cosmos-framework's ``denormalize_action`` does not floor), so it is
the exact inverse even for a constant channel. No clipping either way.

Works on numpy arrays (computed in float64, returned in the input's float dtype) and on torch
tensors (computed in the tensor's dtype and device), without importing torch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from rlinf_cosmos3.actions.conversion import ACTION_DIM_10
from rlinf_cosmos3.actions.stats import load_action_stats, validate_action_stats
from rlinf_cosmos3.config.model_settings import NORMALIZATIONS

RANGE_FLOOR = 1e-8
SUPPORTED_METHODS = NORMALIZATIONS
# Which stats block each method reads.
_STATS_BLOCK = {"quantile_rot": "global_raw"}

T = TypeVar("T")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _prepare(a: Any, q01: ArrayLike, q99: ArrayLike) -> tuple[Any, Any, Any, Any]:
    """Cast inputs for the computation and return (a, q01, range, output dtype)."""
    lo = np.asarray(q01, dtype=np.float64)
    span = np.maximum(np.asarray(q99, dtype=np.float64) - lo, RANGE_FLOOR)
    if _is_torch(a):
        return a, a.new_tensor(lo), a.new_tensor(span), None
    arr = np.asarray(a)
    dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.dtype(np.float64)
    return arr.astype(np.float64, copy=False), lo, span, dtype


def quantile_normalize(a: T, q01: ArrayLike, q99: ArrayLike) -> T:
    """``2 (a - q01) / max(q99 - q01, 1e-8) - 1`` per channel, broadcast over leading dims."""
    x, lo, span, dtype = _prepare(a, q01, q99)
    out = 2.0 * (x - lo) / span - 1.0
    return out if dtype is None else out.astype(dtype, copy=False)


def quantile_denormalize(a_n: T, q01: ArrayLike, q99: ArrayLike) -> T:
    """``(a_n + 1) / 2 * max(q99 - q01, 1e-8) + q01``: the exact inverse of quantile_normalize."""
    x, lo, span, dtype = _prepare(a_n, q01, q99)
    out = (x + 1.0) / 2.0 * span + lo
    return out if dtype is None else out.astype(dtype, copy=False)


class ActionNormalizer:
    """Normalises 10-D actions with one stats file; the method decides which block is read.

    ``stats`` is a stats dict (as ``load_action_stats`` returns) or a path to a stats JSON file.
    """

    def __init__(self, stats: Mapping[str, Any] | str | os.PathLike[str], method: str = "quantile_rot"):
        if method not in SUPPORTED_METHODS:
            raise ValueError(
                f"unsupported action normalisation method {method!r}; supported: {', '.join(SUPPORTED_METHODS)}"
            )
        if isinstance(stats, str | os.PathLike):
            self.source = os.fspath(stats)
            stats = load_action_stats(stats)
        else:
            self.source = "<stats dict>"
            stats = validate_action_stats(stats, source=self.source)
        self.method = method
        self.metadata: dict[str, Any] = dict(stats["metadata"])
        block = stats[_STATS_BLOCK[method]]
        self.q01 = np.asarray(block["q01"], dtype=np.float64)
        self.q99 = np.asarray(block["q99"], dtype=np.float64)

    def _check(self, a: Any) -> None:
        if a.shape[-1] != ACTION_DIM_10:
            raise ValueError(
                f"ActionNormalizer: expected actions [..., {ACTION_DIM_10}], got shape {tuple(a.shape)}"
            )

    def normalize(self, a10: T) -> T:
        """10-D actions -> model range (about [-1, 1]; values outside q01..q99 go beyond it)."""
        self._check(a10 if _is_torch(a10) else np.asarray(a10))
        return quantile_normalize(a10, self.q01, self.q99)

    def denormalize(self, a10: T) -> T:
        """Model output -> 10-D actions in data units."""
        self._check(a10 if _is_torch(a10) else np.asarray(a10))
        return quantile_denormalize(a10, self.q01, self.q99)

    def __repr__(self) -> str:
        return f"ActionNormalizer(method={self.method!r}, source={self.source!r})"
