"""Rotation conventions: axis-angle, matrices, rot6d (column layout, the Gram-Schmidt decode), robosuite quats."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation

from rlinf_cosmos3.actions import (
    axis_angle_to_matrix,
    axis_angle_to_rot6d,
    matrix_to_axis_angle,
    matrix_to_rot6d,
    quat_xyzw_to_axis_angle,
    rot6d_to_axis_angle,
    rot6d_to_matrix,
)
from rlinf_cosmos3.paths import libero_python

finite = st.floats(-1.0, 1.0, allow_nan=False)


@st.composite
def unit_axes(draw: st.DrawFn) -> np.ndarray:
    v = np.array([draw(finite), draw(finite), draw(finite)])
    n = np.linalg.norm(v)
    if n < 1e-3:
        v, n = np.array([0.0, 0.0, 1.0]), 1.0
    return v / n


@st.composite
def rotations(draw: st.DrawFn) -> np.ndarray:
    """Uniform-ish rotation matrices from a drawn unit quaternion."""
    q = np.array([draw(finite) for _ in range(4)])
    if np.linalg.norm(q) < 1e-3:
        q = np.array([0.0, 0.0, 0.0, 1.0])
    return Rotation.from_quat(q / np.linalg.norm(q)).as_matrix()


def rodrigues(aa: np.ndarray) -> np.ndarray:
    """Independent reference: R = I + sin(t) K + (1 - cos(t)) K^2."""
    theta = np.linalg.norm(aa)
    if theta == 0.0:
        return np.eye(3)
    k = aa / theta
    kx = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + math.sin(theta) * kx + (1.0 - math.cos(theta)) * kx @ kx


# ---------------------------------------------------------------- hand-checked numbers


def test_rot6d_of_90deg_about_z_is_first_two_columns() -> None:
    # Rz(90) = [[0,-1,0],[1,0,0],[0,0,1]]: column 0 = (0,1,0), column 1 = (-1,0,0).
    r6 = axis_angle_to_rot6d(np.array([0.0, 0.0, math.pi / 2]))
    np.testing.assert_allclose(r6, [0.0, 1.0, 0.0, -1.0, 0.0, 0.0], atol=1e-15)


def test_rot6d_is_column_major_for_a_non_symmetric_rotation() -> None:
    aa = np.array([0.3, -0.5, 0.8])
    rot = rodrigues(aa)
    assert not np.allclose(rot, rot.T)  # rows and columns differ, so the test can tell them apart
    r6 = axis_angle_to_rot6d(aa)
    np.testing.assert_allclose(
        r6, [rot[0, 0], rot[1, 0], rot[2, 0], rot[0, 1], rot[1, 1], rot[2, 1]], atol=1e-14
    )
    assert not np.allclose(r6, np.concatenate([rot[0], rot[1]]))
    np.testing.assert_allclose(matrix_to_rot6d(rot), r6, atol=1e-14)


def test_gram_schmidt_of_non_orthonormal_six_vector() -> None:
    # c0 = (0,0,3)/3 = (0,0,1); c1 = (0,2,2) - 2*(0,0,1) = (0,2,0) -> (0,1,0); c2 = c0 x c1 = (-1,0,0).
    rot = rot6d_to_matrix(np.array([0.0, 0.0, 3.0, 0.0, 2.0, 2.0]), "gram_schmidt")
    expected = np.array([[0.0, 0.0, -1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # Ry(-90 deg)
    np.testing.assert_allclose(rot, expected, atol=1e-15)
    np.testing.assert_allclose(
        rot6d_to_axis_angle(np.array([0.0, 0.0, 3.0, 0.0, 2.0, 2.0]), "gram_schmidt"), [0.0, -math.pi / 2, 0.0],
        atol=1e-12
    )
    # Scaling and a component of c1 along c0 do not change the rotation.
    np.testing.assert_allclose(rot6d_to_matrix(np.array([2.0, 0, 0, 5.0, 3.0, 0]), "gram_schmidt"), np.eye(3),
                               atol=1e-15)


def test_degenerate_rot6d_is_an_error() -> None:
    with pytest.raises(ValueError, match="zero norm"):
        rot6d_to_matrix(np.array([0.0, 0, 0, 0, 1, 0]))
    with pytest.raises(ValueError, match="parallel"):
        rot6d_to_matrix(np.array([1.0, 0, 0, 2, 0, 0]))
    with pytest.raises(ValueError, match="NaN"):
        rot6d_to_matrix(np.array([np.nan, 0, 0, 0, 1, 0]))


def test_shapes_and_dtypes() -> None:
    aa32 = np.zeros((2, 5, 3), dtype=np.float32)
    assert axis_angle_to_matrix(aa32).shape == (2, 5, 3, 3)
    assert axis_angle_to_matrix(aa32).dtype == np.float32
    assert axis_angle_to_rot6d(aa32).shape == (2, 5, 6)
    assert rot6d_to_axis_angle(axis_angle_to_rot6d(aa32)).dtype == np.float32
    assert axis_angle_to_rot6d([0, 0, 1]).dtype == np.float64  # ints and lists give float64
    assert axis_angle_to_matrix(np.zeros((0, 3))).shape == (0, 3, 3)
    with pytest.raises(ValueError, match=r"trailing shape \(3,\)"):
        axis_angle_to_matrix(np.zeros((4, 4)))
    with pytest.raises(ValueError, match=r"trailing shape \(3, 3\)"):
        matrix_to_rot6d(np.zeros((3, 4)))


def test_angle_pi_round_trips_up_to_axis_sign() -> None:
    aa = np.array([0.0, math.pi, 0.0])
    back = rot6d_to_axis_angle(axis_angle_to_rot6d(aa))
    assert np.allclose(back, aa, atol=1e-9) or np.allclose(back, -aa, atol=1e-9)


# ---------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(axis=unit_axes(), angle=st.floats(0.0, math.pi - 1e-6))
def test_axis_angle_rot6d_axis_angle_round_trip(axis: np.ndarray, angle: float) -> None:
    aa = axis * angle
    np.testing.assert_allclose(rot6d_to_axis_angle(axis_angle_to_rot6d(aa)), aa, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(axis=unit_axes(), angle=st.floats(math.pi - 1e-6, math.pi))
def test_near_pi_the_rotation_survives(axis: np.ndarray, angle: float) -> None:
    # Near pi the axis sign is ill-conditioned; the rotation itself must survive.
    aa = axis * angle
    back = rot6d_to_axis_angle(axis_angle_to_rot6d(aa))
    np.testing.assert_allclose(axis_angle_to_matrix(back), rodrigues(aa), atol=1e-9)
    assert np.linalg.norm(back) <= math.pi + 1e-12


@settings(max_examples=200, deadline=None)
@given(axis=unit_axes(), angle=st.floats(0.0, 2 * math.pi))
def test_axis_angle_to_matrix_matches_rodrigues(axis: np.ndarray, angle: float) -> None:
    aa = axis * angle
    np.testing.assert_allclose(axis_angle_to_matrix(aa), rodrigues(aa), atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(rot=rotations())
def test_matrix_rot6d_matrix_round_trip(rot: np.ndarray) -> None:
    np.testing.assert_allclose(rot6d_to_matrix(matrix_to_rot6d(rot)), rot, atol=1e-12)
    np.testing.assert_allclose(
        matrix_to_rot6d(rot6d_to_matrix(matrix_to_rot6d(rot))), matrix_to_rot6d(rot), atol=1e-12
    )
    np.testing.assert_allclose(axis_angle_to_matrix(matrix_to_axis_angle(rot)), rot, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(r6=st.lists(st.floats(-10, 10, allow_nan=False), min_size=6, max_size=6))
def test_gram_schmidt_gives_a_proper_rotation(r6: list[float]) -> None:
    v = np.array(r6)
    a0, a1 = v[:3], v[3:]
    n0 = np.linalg.norm(a0)
    if n0 < 1e-3 or np.linalg.norm(np.cross(a0, a1)) < 1e-3 * n0 * max(np.linalg.norm(a1), 1e-3):
        return  # degenerate inputs are covered by test_degenerate_rot6d_is_an_error
    rot = rot6d_to_matrix(v, "gram_schmidt")
    np.testing.assert_allclose(rot.T @ rot, np.eye(3), atol=1e-12)
    assert np.linalg.det(rot) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(rot[:, 0], a0 / n0, atol=1e-12)  # first column keeps its direction
    assert np.dot(rot[:, 1], a1) > 0  # second column stays on a1's side


# ---------------------------------------------------------------- robosuite quaternions


def test_quat_hand_values() -> None:
    s = math.sin(math.pi / 4)
    np.testing.assert_allclose(quat_xyzw_to_axis_angle([0.0, 0.0, s, s]), [0.0, 0.0, math.pi / 2], atol=1e-15)
    assert np.all(quat_xyzw_to_axis_angle([0.0, 0.0, 0.0, 1.0]) == 0.0)
    assert np.all(quat_xyzw_to_axis_angle([0.0, 0.0, 0.0, -1.0]) == 0.0)
    assert np.all(quat_xyzw_to_axis_angle([0.3, 0.1, 0.0, 1.5]) == 0.0)  # w clipped to 1 -> zero rotation
    # w < 0 is not canonicalised: angle 2 acos(w) = 3 pi / 2 about +z, like robosuite.
    q = [0.0, 0.0, math.sin(3 * math.pi / 4), math.cos(3 * math.pi / 4)]
    np.testing.assert_allclose(quat_xyzw_to_axis_angle(q), [0.0, 0.0, 1.5 * math.pi], atol=1e-12)
    q32 = np.array([[0.0, 0.0, s, s]] * 3, dtype=np.float32)
    assert quat_xyzw_to_axis_angle(q32).dtype == np.float32
    assert quat_xyzw_to_axis_angle(q32).shape == (3, 3)


def test_quat_input_is_not_mutated() -> None:
    q = np.array([0.0, 0.0, 0.0, 1.2])
    quat_xyzw_to_axis_angle(q)
    assert q[3] == 1.2  # robosuite clips in place; we must not


@settings(max_examples=200, deadline=None)
@given(rot=rotations())
def test_quat_gives_the_same_rotation_as_scipy(rot: np.ndarray) -> None:
    q = Rotation.from_matrix(rot).as_quat()  # x, y, z, w
    # robosuite's formula reads the angle from w = cos(angle / 2): near the identity float64 rounds w to 1
    # for angles below ~3e-8 (then the zero vector, as robosuite), so agreement is to ~sqrt(eps), not eps.
    np.testing.assert_allclose(axis_angle_to_matrix(quat_xyzw_to_axis_angle(q)), rot, atol=5e-8)


_ROBOSUITE_SCRIPT = """
import json, sys
import numpy as np
import robosuite.utils.transform_utils as T
qs = json.load(sys.stdin)
print(json.dumps([T.quat2axisangle(np.array(q, dtype=np.float64)).tolist() for q in qs]))
"""


@pytest.mark.libero
def test_quat_matches_robosuite_quat2axisangle() -> None:
    """Same numbers as robosuite's own function, run in the simulator environment."""
    python = libero_python()
    if not python.exists():
        pytest.skip(f"simulator environment not built: {python}")
    rng = np.random.default_rng(0)
    qs = rng.normal(size=(200, 4))
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    extra = np.array(
        [
            [0.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, 0.0, -1.0],
            [0.1, 0.2, 0.3, 1.0000001],  # un-normalised, w clipped
            [0.1, 0.2, 0.3, -1.2],
            [1e-9, 0.0, 0.0, 1.0 - 1e-17],
            [0.5, 0.5, 0.5, -0.5],
            [0.0, 0.6, 0.8, 0.0],  # angle exactly pi
        ]
    )
    qs = np.concatenate([qs, extra])
    proc = subprocess.run(
        [str(python), "-c", _ROBOSUITE_SCRIPT],
        input=json.dumps(qs.tolist()),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    expected = np.array(json.loads(proc.stdout.strip().splitlines()[-1]))
    np.testing.assert_allclose(quat_xyzw_to_axis_angle(qs), expected, rtol=1e-13, atol=1e-13)
