"""Per-suite facts of LIBERO, shared by demonstration recording and evaluation.

The one home of these conventions (docs/architecture.md, "Where each convention lives"). In ``config/``
because the ``env.eval`` section takes its defaults from them, resolves each suite's step cap and task
list by them and checks its values against them, and configs import nothing above ``config/``; standard
library only, since the recorder and the simulator side read them too.
"""

from __future__ import annotations

# Episode step caps of the cosmos/RLinf LIBERO evaluation; a success rate is reported with its cap.
SUITE_MAX_STEPS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
# Tasks per suite and fixed init states per task, as shipped by LIBERO (rlinf-libero 0.1.3).
SUITE_NUM_TASKS: dict[str, int] = {
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}
NUM_INIT_STATES = 50
# Suites whose tasks all share one scene: their BDDL files declare the same fixtures, objects and init
# regions and differ only in the goal and the language (libero_goal: one kitchen), so a fixed init state
# of one task is a valid start for any other (``env.eval.init_states_from_task``). Not libero_spatial or
# libero_object, whose tasks place the objects in other regions or hold other objects.
SHARED_SCENE_SUITES: tuple[str, ...] = ("libero_goal",)
# No-op steps run after a reset so objects settle before the policy acts (LIBERO eval practice).
NUM_SETTLE_STEPS = 10
ACTION_DIM = 7
"""Width of a LIBERO command and of a stored dataset action: ``[dpos(3), drot axis-angle(3), gripper(1)]``."""
STATE_DIM = 8
"""Width of the robot state (``observation.state``): eef pos(3), eef axis-angle(3), gripper qpos(2)."""
# The no-op command: no motion, gripper open (LIBERO: -1 = open).
NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)


def suite_max_steps(suite: str) -> int:
    """The step cap of ``suite``; a clear error for an unknown suite."""
    try:
        return SUITE_MAX_STEPS[suite]
    except KeyError:
        raise ValueError(f"unknown LIBERO suite {suite!r}; known: {sorted(SUITE_MAX_STEPS)}") from None
