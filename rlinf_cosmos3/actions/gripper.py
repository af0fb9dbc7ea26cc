"""The gripper rule between LIBERO commands and the gripper value the data and model use.

LIBERO/robosuite command: -1 = open, +1 = close. The value a dataset stores (and so the value a
model trained on it predicts) follows one of three conventions, the ones cosmos-framework's
closed-loop eval knows (``cosmos_framework/simulation/libero/closed_loop_eval.py::_remap_gripper``):

* ``zero_one`` (NVIDIA's LIBERO LeRobot data, and ours): ``g in [0, 1]``, 1 = open, ``g = (1 - a) / 2``;
* ``pm_one`` (the community ``lerobot/libero_*`` data): ``g in {-1, +1}``, robosuite's sign, ``g = a``;
* ``pm_one_flip``: ``{-1, +1}`` with the sign inverted, ``g = -a``.

Each turns into a signed "close" value ``s`` (``1 - 2g``, ``g``, ``-g``; negative = open). Back to
the simulator, ``command="binary"`` sends ``-1.0`` if ``s < 0`` else ``+1.0``; for ``zero_one`` that
is ``-sign(2g - 1)``, what RLinf (``rlinf/envs/action_utils.py::prepare_actions_for_libero``) and
the "i4/cosmos-rl reference" in ``_remap_gripper``'s docstring do. ``command="continuous"`` sends
``clip(s, -1, 1)``, what ``_remap_gripper``'s code does.

Why binary is the default: LIBERO's gripper controller actuates in proportion to the command, so a
hesitant prediction (``g`` near 0.5, typical of an undertrained policy) sent continuously is a
command near 0 that never closes the gripper, and grasps fail; binarising commits to open or close.
For a confident policy (``g`` near 0 or 1) the two agree.

Tie ``s == 0`` (``g == 0.5`` for ``zero_one``): ``np.sign`` gives 0 there, a "neither" command. We
define it instead: the tie closes (+1). Binary output is always exactly -1.0 or +1.0.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from rlinf_cosmos3.config.model_settings import GRIPPER_CONVENTIONS  # how a dataset stores the gripper

GRIPPER_COMMANDS = ("binary", "continuous")
"""How the predicted gripper value is sent to the simulator; ``binary`` is the default."""
# Range of the stored value per convention.
GRIPPER_RANGES = {"zero_one": (0.0, 1.0), "pm_one": (-1.0, 1.0), "pm_one_flip": (-1.0, 1.0)}

# Stored gripper value above which the simulator is told to open (zero_one).
GRIPPER_OPEN_THRESHOLD = 0.5
LIBERO_OPEN = -1.0
LIBERO_CLOSE = 1.0


def _float_array(x: ArrayLike) -> np.ndarray:
    arr = np.asarray(x)
    return arr if np.issubdtype(arr.dtype, np.floating) else arr.astype(np.float64)


def _check_convention(convention: str) -> None:
    if convention not in GRIPPER_CONVENTIONS:
        raise ValueError(f"unknown gripper convention {convention!r}; use one of {list(GRIPPER_CONVENTIONS)}")


def libero_command_to_dataset_gripper(a: ArrayLike, convention: str = "zero_one") -> np.ndarray:
    """LIBERO command (-1 open / +1 close) -> the stored value: ``(1 - a) / 2``, ``a`` or ``-a``."""
    _check_convention(convention)
    arr = _float_array(a)
    if convention == "zero_one":
        out = (1.0 - arr) / 2.0
    else:
        out = arr if convention == "pm_one" else -arr
    return np.asarray(out).astype(arr.dtype, copy=False)


def dataset_gripper_to_libero_command(
    g: ArrayLike, convention: str = "zero_one", command: str = "binary"
) -> np.ndarray:
    """Stored/predicted gripper value -> LIBERO command (see the module docstring for the rules).

    ``zero_one`` + ``binary``: -1.0 (open) if g > 0.5, else +1.0 (close, incl. the tie).
    Raises ValueError on NaN, since no command can be read from it.
    """
    _check_convention(convention)
    if command not in GRIPPER_COMMANDS:
        raise ValueError(f"unknown gripper command {command!r}; use one of {list(GRIPPER_COMMANDS)}")
    arr = _float_array(g)
    if np.any(np.isnan(arr)):
        raise ValueError("dataset_gripper_to_libero_command: gripper value is NaN")
    if convention == "zero_one" and command == "binary":
        # Compared on g itself (not 1 - 2g), so no rounding can move a value across the threshold.
        return np.where(arr > GRIPPER_OPEN_THRESHOLD, LIBERO_OPEN, LIBERO_CLOSE).astype(arr.dtype, copy=False)
    close = 1.0 - 2.0 * arr if convention == "zero_one" else (arr if convention == "pm_one" else -arr)
    if command == "binary":
        out = np.where(close < 0.0, LIBERO_OPEN, LIBERO_CLOSE)
    else:
        out = np.clip(close, LIBERO_OPEN, LIBERO_CLOSE)
    return np.asarray(out).astype(arr.dtype, copy=False)


def gripper_range_problem(low: float, high: float, convention: str) -> str | None:
    """Why stored gripper values spanning ``[low, high]`` cannot follow ``convention``; None if they can.

    ``zero_one`` needs ``[0, 1]``; ``pm_one``/``pm_one_flip`` need ``[-1, 1]`` with some negative value
    (a ±1 gripper that is never negative is a ``[0, 1]`` gripper: the convention is almost surely wrong).
    """
    _check_convention(convention)
    lo, hi = GRIPPER_RANGES[convention]
    if low < lo or high > hi:
        guess = "zero_one" if low >= 0.0 else "pm_one or pm_one_flip"
        return f"gripper values span [{low}, {high}], outside {convention}'s [{lo:g}, {hi:g}] (looks like {guess})"
    if convention != "zero_one" and low >= 0.0:
        return f"gripper values span [{low}, {high}], never negative: that is zero_one data, not {convention}"
    return None

