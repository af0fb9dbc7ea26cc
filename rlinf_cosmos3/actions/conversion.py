"""7-D LIBERO actions <-> 10-D model actions.

7-D (stored in the LeRobot data, consumed by the simulator after the gripper rule):
``[dpos(3), drot axis-angle(3), gripper(1)]``, a per-step delta. 10-D (what Cosmos3 predicts):
``[dpos(3), rot6d(6), gripper(1)]``. Only the rotation is re-encoded ("frame_wise_relative" for
LIBERO, as in cosmos-framework's ``LIBEROLeRobotDataset._build_frame_wise_action``); translation
and the gripper channel pass through unchanged.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from rlinf_cosmos3.actions._arrays import as_float64
from rlinf_cosmos3.actions.rotation import axis_angle_to_rot6d, rot6d_to_axis_angle
from rlinf_cosmos3.config.libero_suites import ACTION_DIM as ACTION_DIM_7

ACTION_DIM_10 = 10
# Channel layout of the 10-D action (also used to build the "global" stats block).
POS_SLICE_10 = slice(0, 3)
ROT6D_SLICE_10 = slice(3, 9)
GRIPPER_INDEX_10 = 9
GRIPPER_INDEX_7 = 6
"""The gripper channel of the 7-D LIBERO command (and of a 7-D dataset action)."""


def actions_7_to_10(a: ArrayLike) -> np.ndarray:
    """``[..., 7]`` axis-angle actions -> ``[..., 10]`` rot6d actions."""
    x, dtype = as_float64(a, ACTION_DIM_7, "actions_7_to_10")
    out = np.concatenate([x[..., 0:3], axis_angle_to_rot6d(x[..., 3:6]), x[..., 6:7]], axis=-1)
    return out.astype(dtype, copy=False)


def actions_10_to_7(a: ArrayLike, rot6d_decode: str = "svd") -> np.ndarray:
    """``[..., 10]`` rot6d actions -> ``[..., 7]`` axis-angle actions.

    ``rot6d_decode``: ``svd`` (cosmos-framework's eval, the default) or ``gram_schmidt`` (RLinf's);
    see :func:`rlinf_cosmos3.actions.rotation.rot6d_to_matrix`.
    """
    x, dtype = as_float64(a, ACTION_DIM_10, "actions_10_to_7")
    out = np.concatenate([x[..., 0:3], rot6d_to_axis_angle(x[..., 3:9], rot6d_decode), x[..., 9:10]], axis=-1)
    return out.astype(dtype, copy=False)
