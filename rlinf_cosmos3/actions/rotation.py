"""Rotation conversions between axis-angle, matrices, rot6d and robosuite quaternions.

Conventions (docs/action_conventions.md):

* axis-angle ``aa = angle * unit_axis`` (a rotation vector), radians.
* rot6d = the first two **columns** of the rotation matrix, flattened column by column:
  ``[R00, R10, R20, R01, R11, R21]``. This is what NVIDIA's cosmos-framework uses
  (``cosmos_framework/data/generator/action/utils/pose_utils.py``: "column-based 6D
  representation"), so our 10-D actions line up with the released Cosmos3 LIBERO stats.
* Decoding rot6d (``method="svd"``, the default) is cosmos-framework's closed-loop eval rule:
  stack ``[c0, c1, c0 x c1]`` as columns and project that matrix onto SO(3) by SVD (the nearest
  rotation in the Frobenius norm). ``method="gram_schmidt"`` (normalise c0; remove c0 from c1,
  normalise; c2 = c0 x c1) is RLinf's rule. Both are exact for rot6d of a real rotation; they
  differ for a noisy model output, which is why evaluation must decode as the training's
  reference eval does.

All functions are vectorised over leading dims, compute in float64 and return the input's
floating dtype (float64 for integer input).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.spatial.transform import Rotation

from rlinf_cosmos3.actions._arrays import as_float64

# Below this norm a rot6d column carries no direction; decoding it would invent one.
_DEGENERATE_NORM = 1e-12


def axis_angle_to_matrix(aa: ArrayLike) -> np.ndarray:
    """Rotation vectors ``[..., 3]`` -> rotation matrices ``[..., 3, 3]`` (Rodrigues, via scipy)."""
    x, dtype = as_float64(aa, 3, "axis_angle_to_matrix")
    mats = Rotation.from_rotvec(x.reshape(-1, 3)).as_matrix()
    return mats.reshape(x.shape[:-1] + (3, 3)).astype(dtype, copy=False)


def matrix_to_axis_angle(rot: ArrayLike) -> np.ndarray:
    """Rotation matrices ``[..., 3, 3]`` -> rotation vectors ``[..., 3]`` with angle in ``[0, pi]``.

    scipy projects a slightly non-orthonormal input onto the nearest rotation first.
    """
    x, dtype = as_float64(rot, (3, 3), "matrix_to_axis_angle")
    vecs = Rotation.from_matrix(x.reshape(-1, 3, 3)).as_rotvec()
    return vecs.reshape(x.shape[:-2] + (3,)).astype(dtype, copy=False)


def matrix_to_rot6d(rot: ArrayLike) -> np.ndarray:
    """Rotation matrices ``[..., 3, 3]`` -> rot6d ``[..., 6]`` = ``[R00, R10, R20, R01, R11, R21]``."""
    x, dtype = as_float64(rot, (3, 3), "matrix_to_rot6d")
    r6 = np.concatenate([x[..., :, 0], x[..., :, 1]], axis=-1)
    return r6.astype(dtype, copy=False)


ROT6D_DECODES = ("svd", "gram_schmidt")
"""How a 6-vector becomes a rotation: cosmos-framework's SVD projection (default) or Gram-Schmidt."""


def rot6d_to_matrix(r6: ArrayLike, method: str = "svd") -> np.ndarray:
    """rot6d ``[..., 6]`` -> rotation matrices ``[..., 3, 3]`` (``method``: ``svd`` or ``gram_schmidt``).

    ``svd``: ``M = [a0, a1, a0 x a1]`` (columns), then ``U V^T`` of ``M = U S V^T``. For independent
    ``a0, a1`` the third column makes ``det M = |a0 x a1|^2 > 0``, so ``U V^T`` is already a proper
    rotation and no reflection fix is needed. ``gram_schmidt``: see the module docstring.

    Raises ValueError for non-finite input or a degenerate 6-vector (a zero first column, or a
    second column parallel to the first), because no rotation can be read from it.
    """
    if method not in ROT6D_DECODES:
        raise ValueError(f"unknown rot6d decode {method!r}; use one of {list(ROT6D_DECODES)}")
    x, dtype = as_float64(r6, 6, "rot6d_to_matrix")
    if not np.all(np.isfinite(x)):
        raise ValueError("rot6d_to_matrix: input contains NaN or inf")
    a0, a1 = x[..., 0:3], x[..., 3:6]
    n0 = np.linalg.norm(a0, axis=-1, keepdims=True)
    if np.any(n0 < _DEGENERATE_NORM):
        raise ValueError("rot6d_to_matrix: first column has zero norm; cannot build a rotation")
    c0 = a0 / n0
    # |c0 x a1| is the part of a1 orthogonal to a0: zero when the columns are parallel.
    if np.any(np.linalg.norm(np.cross(c0, a1), axis=-1) < _DEGENERATE_NORM):
        raise ValueError("rot6d_to_matrix: second column is parallel to the first; cannot build a rotation")
    if method == "svd":
        stacked = np.stack([a0, a1, np.cross(a0, a1)], axis=-1)
        u, _, vt = np.linalg.svd(stacked)
        return (u @ vt).astype(dtype, copy=False)
    u1 = a1 - np.sum(c0 * a1, axis=-1, keepdims=True) * c0
    c1 = u1 / np.linalg.norm(u1, axis=-1, keepdims=True)
    c2 = np.cross(c0, c1)
    return np.stack([c0, c1, c2], axis=-1).astype(dtype, copy=False)


def axis_angle_to_rot6d(aa: ArrayLike) -> np.ndarray:
    """Rotation vectors ``[..., 3]`` -> rot6d ``[..., 6]``."""
    x, dtype = as_float64(aa, 3, "axis_angle_to_rot6d")
    return matrix_to_rot6d(axis_angle_to_matrix(x)).astype(dtype, copy=False)


def rot6d_to_axis_angle(r6: ArrayLike, method: str = "svd") -> np.ndarray:
    """rot6d ``[..., 6]`` -> rotation vectors ``[..., 3]`` (decoded by ``method``, then angle in ``[0, pi]``)."""
    x, dtype = as_float64(r6, 6, "rot6d_to_axis_angle")
    return matrix_to_axis_angle(rot6d_to_matrix(x, method)).astype(dtype, copy=False)


def quat_xyzw_to_axis_angle(q: ArrayLike) -> np.ndarray:
    """robosuite/LIBERO quaternions ``[..., 4]`` (x, y, z, w) -> rotation vectors ``[..., 3]``.

    Reproduces ``robosuite.utils.transform_utils.quat2axisangle`` (robosuite 1.4) exactly,
    vectorised and without mutating the input: w is clipped to [-1, 1]; the angle is
    ``2 acos(w)`` (so w < 0 gives an angle in (pi, 2 pi], no canonicalisation); the quaternion is
    not re-normalised; and ``den = sqrt(1 - w^2) == 0`` (robosuite's ``math.isclose(den, 0.0)``
    with default tolerances is true only for exactly 0) returns the zero vector.
    """
    x, dtype = as_float64(q, 4, "quat_xyzw_to_axis_angle")
    w = np.clip(x[..., 3], -1.0, 1.0)
    den = np.sqrt(1.0 - w * w)
    zero = den == 0.0
    scale = np.where(zero, 0.0, 2.0 * np.arccos(w) / np.where(zero, 1.0, den))
    return (x[..., :3] * scale[..., None]).astype(dtype, copy=False)
