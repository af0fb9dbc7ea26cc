"""The gripper rule between LIBERO commands and the gripper value the data and model use.

LIBERO/robosuite command: -1 = open, +1 = close. NVIDIA's LIBERO LeRobot data (and so the model)
store ``g in [0, 1]`` with 1 = open: ``g = (1 - a) / 2``. Back to the simulator the value is
binarised with ``-sign(2g - 1)``, as the "i4/cosmos-rl reference" described in cosmos-framework
``cosmos_framework/simulation/libero/closed_loop_eval.py::_remap_gripper`` and RLinf
``rlinf/envs/action_utils.py::prepare_actions_for_libero`` do.

Tie at g == 0.5: both references use ``np.sign``, which gives 0 there — a "neither" command the
gripper controller reads as half-closed. We define it instead: open only when g > 0.5, so the tie
closes (+1). The output is always exactly -1.0 or +1.0.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

# Stored gripper value above which the simulator is told to open.
GRIPPER_OPEN_THRESHOLD = 0.5
LIBERO_OPEN = -1.0
LIBERO_CLOSE = 1.0


def _float_array(x: ArrayLike) -> np.ndarray:
    arr = np.asarray(x)
    return arr if np.issubdtype(arr.dtype, np.floating) else arr.astype(np.float64)


def libero_command_to_dataset_gripper(a: ArrayLike) -> np.ndarray:
    """LIBERO command (-1 open / +1 close) -> stored g = (1 - a) / 2 in [0, 1], 1 = open."""
    arr = _float_array(a)
    return ((1.0 - arr) / 2.0).astype(arr.dtype, copy=False)


def dataset_gripper_to_libero_command(g: ArrayLike) -> np.ndarray:
    """Stored/predicted g -> LIBERO command: -1.0 (open) if g > 0.5, else +1.0 (close, incl. the tie).

    Raises ValueError on NaN, since no command can be read from it.
    """
    arr = _float_array(g)
    if np.any(np.isnan(arr)):
        raise ValueError("dataset_gripper_to_libero_command: gripper value is NaN")
    return np.where(arr > GRIPPER_OPEN_THRESHOLD, LIBERO_OPEN, LIBERO_CLOSE).astype(arr.dtype, copy=False)
