"""Skip robosuite's second ``MjSim.forward`` of a physics substep: it recomputes what the first just computed.

robosuite's ``MujocoEnv.step`` runs, on each of a control step's 25 physics substeps, ``sim.forward()``, then
the robot's controller, whose ``update`` calls ``sim.forward()`` again before it reads the arm's pose,
Jacobians and mass matrix, then ``sim.step()``. Nothing between the two forwards changes MuJoCo's inputs, so
the second call writes the very values the first wrote. MuJoCo's forward is deterministic in its inputs (it
does not even move the solver's warm start), so skipping the repeat leaves every output bit-identical, while
the forward passes are a large share of a LIBERO step (docs/benchmarks.md, "Simulator scaling").

A forward is skipped only when no ``sim.step()`` ran since the last computed one and the inputs robosuite's
step loop writes (time, joint positions and velocities, controls) are unchanged; anything else computes.
Installed on the session's ``MjSim`` instance for the duration of one ``env.step`` call, like the camera hold
in ``libero_session``: robosuite's own code is not changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class ForwardCounts:
    """Forward calls seen and skipped while installed (for tests and benchmarks)."""

    calls: int = 0
    skipped: int = 0


class _RepeatedForwardSkipper:
    """Instance-level ``forward``/``step`` of one ``MjSim``; remembers the inputs of the last computed forward."""

    def __init__(self, sim: Any, counts: ForwardCounts) -> None:
        self._forward = sim.forward
        self._step = sim.step
        self._data = sim.data._data  # the raw mujoco.MjData
        self._counts = counts
        self._fresh = False
        self._inputs: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _unchanged(self) -> bool:
        if not self._fresh or self._inputs is None:
            return False
        time, qpos, qvel, ctrl = self._inputs
        d = self._data
        return (d.time == time and np.array_equal(d.ctrl, ctrl) and np.array_equal(d.qpos, qpos)
                and np.array_equal(d.qvel, qvel))

    def forward(self) -> None:
        self._counts.calls += 1
        if self._unchanged():
            self._counts.skipped += 1
            return
        self._forward()
        d = self._data
        self._inputs = (float(d.time), d.qpos.copy(), d.qvel.copy(), d.ctrl.copy())
        self._fresh = True

    def step(self, *args: Any, **kwargs: Any) -> None:
        self._fresh = False
        self._step(*args, **kwargs)


@contextmanager
def repeated_forward_skipped(sim: Any, counts: ForwardCounts | None = None) -> Iterator[ForwardCounts]:
    """While open, ``sim.forward()`` returns at once when it would recompute the last forward's inputs."""
    counts = counts if counts is not None else ForwardCounts()
    skipper = _RepeatedForwardSkipper(sim, counts)
    sim.forward, sim.step = skipper.forward, skipper.step
    try:
        yield counts
    finally:
        del sim.forward, sim.step  # the instance attributes go; the class's methods answer again
