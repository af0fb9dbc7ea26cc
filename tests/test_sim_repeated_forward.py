"""Stepping without robosuite's repeated forward pass changes no output (rlinf_cosmos3/sim/repeated_forward.py).

Two real LIBERO simulators built alike, one stepping robosuite exactly as shipped, one skipping the controller's
repeat of each substep's forward: the same commands (down onto the table with the gripper open, close, lift,
then random ones) must give bit-identical images, states, rewards, success flags and object poses, while the
second process skipped about half of its forward calls.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_cosmos3.config.libero_suites import NOOP_ACTION
from rlinf_cosmos3.sim.client import LiberoSimProcess

pytestmark = pytest.mark.libero

CHUNK = 16


def _commands() -> np.ndarray:
    rng = np.random.default_rng(7)
    down = np.tile([0.0, 0.0, -0.8, 0.0, 0.0, 0.0, -1.0], (40, 1))  # into the table: contacts, the solver works
    close = np.tile([0.0, 0.0, -0.2, 0.0, 0.0, 0.0, 1.0], (24, 1))
    lift = np.tile([0.0, 0.0, 0.8, 0.0, 0.0, 0.0, 1.0], (24, 1))
    random = rng.uniform(-0.6, 0.6, (40, 7))
    random[:, 6] = np.sign(random[:, 6])
    return np.concatenate([down, close, lift, random])


def _run(skip: bool) -> tuple[list[dict], dict]:
    with LiberoSimProcess(name=f"forward-skip-{skip}") as proc:
        proc.make("libero_spatial", 0, seed=0, skip_repeated_forward=skip)
        proc.reset(2)
        proc.chunk_step(np.tile(NOOP_ACTION, (10, 1)))
        commands = _commands()
        replies = [proc.chunk_step(commands[i:i + CHUNK], privileged=True) for i in range(0, len(commands), CHUNK)]
        replies.append(proc.step(commands[-1], privileged=True))  # the single-step path too
        return replies, proc.request("forward_counts")


def _assert_same(a: object, b: object, where: str) -> int:
    """Bit-equal, recursively; returns how many arrays were compared."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        return sum(_assert_same(a[k], b[k], f"{where}.{k}") for k in a)
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        return sum(_assert_same(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True)))
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
        return 1
    assert a == b, where
    return 0


def test_skipping_the_repeated_forward_changes_no_output() -> None:
    shipped, shipped_counts = _run(skip=False)
    skipping, counts = _run(skip=True)
    assert shipped_counts["skipped"] == 0
    assert counts["calls"] > 0 and counts["skipped"] >= 0.45 * counts["calls"], counts
    compared = sum(_assert_same(a, b, "reply") for a, b in zip(shipped, skipping, strict=True))
    assert compared > 10 * len(shipped)
    # the commands did move the arm and close the gripper on the way (not a no-op comparison)
    assert abs(float(shipped[1]["state"][2]) - float(shipped[0]["state"][2])) > 0.01
    assert skipping[-1]["main_image"].std() > 10
