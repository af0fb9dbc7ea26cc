"""7-D <-> 10-D action conversion and the gripper rule."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlinf_cosmos3.actions import (
    actions_7_to_10,
    actions_10_to_7,
    axis_angle_to_rot6d,
    dataset_gripper_to_libero_command,
    libero_command_to_dataset_gripper,
)
from rlinf_cosmos3.paths import libero_python


@st.composite
def actions7(draw: st.DrawFn) -> np.ndarray:
    """[T, 7] actions with rotation angles below pi (where axis-angle is unique)."""
    t = draw(st.integers(1, 6))
    pos = draw(hnp.arrays(np.float64, (t, 3), elements=st.floats(-1, 1)))
    axis = draw(hnp.arrays(np.float64, (t, 3), elements=st.floats(-1, 1)))
    norm = np.linalg.norm(axis, axis=1, keepdims=True)
    axis = np.where(norm < 1e-3, np.array([[1.0, 0.0, 0.0]]), axis / np.maximum(norm, 1e-3))
    angle = draw(hnp.arrays(np.float64, (t, 1), elements=st.floats(0.0, math.pi - 1e-6)))
    grip = draw(hnp.arrays(np.float64, (t, 1), elements=st.floats(0, 1)))
    return np.concatenate([pos, axis * angle, grip], axis=1)


@settings(max_examples=200, deadline=None)
@given(a=actions7())
def test_7_to_10_to_7_round_trip(a: np.ndarray) -> None:
    a10 = actions_7_to_10(a)
    assert a10.shape == (a.shape[0], 10)
    np.testing.assert_array_equal(a10[:, :3], a[:, :3])  # translation passes through untouched
    np.testing.assert_array_equal(a10[:, 9], a[:, 6])  # so does the gripper
    np.testing.assert_allclose(actions_10_to_7(a10), a, atol=1e-9)


def test_layout_by_hand() -> None:
    a = np.array([0.1, -0.2, 0.3, 0.0, 0.0, math.pi / 2, 0.25])
    a10 = actions_7_to_10(a)
    np.testing.assert_allclose(a10, [0.1, -0.2, 0.3, 0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 0.25], atol=1e-15)
    np.testing.assert_allclose(a10[3:9], axis_angle_to_rot6d(a[3:6]))


def test_10_to_7_decodes_a_noisy_rot6d_and_keeps_the_gripper() -> None:
    # A model output whose rot6d is not orthonormal: Gram-Schmidt turns (2,0,0 | 0.3,0.5,0) into the identity.
    a10 = np.array([0.5, 0.0, -0.5, 2.0, 0.0, 0.0, 0.3, 0.5, 0.0, 0.7], dtype=np.float32)
    a7 = actions_10_to_7(a10, rot6d_decode="gram_schmidt")
    assert a7.dtype == np.float32
    np.testing.assert_allclose(a7, [0.5, 0.0, -0.5, 0.0, 0.0, 0.0, 0.7], atol=1e-7)


def test_batch_dims_and_shape_errors() -> None:
    a = np.zeros((4, 16, 7), dtype=np.float32)
    assert actions_7_to_10(a).shape == (4, 16, 10)
    assert actions_7_to_10(a).dtype == np.float32
    assert actions_10_to_7(actions_7_to_10(a)).shape == (4, 16, 7)
    with pytest.raises(ValueError, match="actions_7_to_10"):
        actions_7_to_10(np.zeros((16, 10)))
    with pytest.raises(ValueError, match="actions_10_to_7"):
        actions_10_to_7(np.zeros((16, 7)))


# ---------------------------------------------------------------- gripper


def test_gripper_command_to_stored_value() -> None:
    np.testing.assert_array_equal(libero_command_to_dataset_gripper([-1.0, 1.0, 0.0]), [1.0, 0.0, 0.5])
    assert libero_command_to_dataset_gripper(np.float32(-1.0)).dtype == np.float32


def test_gripper_stored_value_to_command_including_the_tie() -> None:
    g = np.array([0.0, 0.2, 0.5, np.nextafter(0.5, 1.0), 0.8, 1.0, -0.3, 1.4])
    expected = np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0, -1.0])  # open (-1) only when g > 0.5
    np.testing.assert_array_equal(dataset_gripper_to_libero_command(g), expected)
    assert dataset_gripper_to_libero_command(0.5) == 1.0
    with pytest.raises(ValueError, match="NaN"):
        dataset_gripper_to_libero_command([0.2, np.nan])


@settings(max_examples=200, deadline=None)
@given(g=hnp.arrays(np.float64, st.integers(1, 20), elements=st.floats(-2, 3)))
def test_gripper_command_is_binary_and_inverts_the_storage_rule(g: np.ndarray) -> None:
    cmd = dataset_gripper_to_libero_command(g)
    assert set(np.unique(cmd)) <= {-1.0, 1.0}
    # Storing a command and reading it back gives the command again.
    np.testing.assert_array_equal(
        dataset_gripper_to_libero_command(libero_command_to_dataset_gripper(cmd)), cmd
    )
    # Away from the tie it is -sign(2g - 1), the references' rule.
    away = np.abs(2 * g - 1) > 0
    np.testing.assert_array_equal(cmd[away], -np.sign(2 * g[away] - 1))


_SIM_ENV_SCRIPT = """
import json, sys
import numpy as np
from rlinf_cosmos3.actions import actions_10_to_7, dataset_gripper_to_libero_command
a10 = np.array(json.load(sys.stdin))
a7 = actions_10_to_7(a10)
a7[:, 6] = dataset_gripper_to_libero_command(a7[:, 6])
print(json.dumps({"a7": a7.tolist(), "heavy": sorted(m for m in ("torch", "lerobot") if m in sys.modules)}))
"""


@pytest.mark.libero
def test_simulator_environment_decodes_actions_like_the_main_one() -> None:
    """The simulator side (numpy < 2, no torch) imports the package and gets the same 7-D commands."""
    python = libero_python()
    if not python.exists():
        pytest.skip(f"simulator environment not built: {python}")
    rng = np.random.default_rng(3)
    a7 = np.concatenate(
        [rng.normal(size=(16, 3)), rng.normal(scale=0.3, size=(16, 3)), rng.random((16, 1))], axis=1
    )
    a10 = actions_7_to_10(a7) + rng.normal(scale=1e-3, size=(16, 10))  # a slightly noisy "model output"
    proc = subprocess.run(
        [str(python), "-c", _SIM_ENV_SCRIPT],
        input=json.dumps(a10.tolist()),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    expected = actions_10_to_7(a10)
    expected[:, 6] = dataset_gripper_to_libero_command(expected[:, 6])
    np.testing.assert_allclose(np.array(result["a7"]), expected, rtol=1e-12, atol=1e-12)
