"""How high an episode lifted the objects its task's goal moves: tells a missed grasp from a later failure.

A pick-and-place failure either never picks the object up (the grasp missed or slipped: the object
stays on its support) or picks it up and then fails (carried but not placed, or dropped). Watching
the videos tells them apart; so does the simulator's ground truth, which every ``chunk_step`` reply
carries when asked for the privileged state: the height of each object named as the moved one in
the goal's ``on``/``in`` predicates. The rise is measured above where the object rested once the
settle steps had run, and sampled at the end of each chunk (every ``open_loop_steps`` commands), so
a lift shorter than one chunk can be missed; a carry lasts many chunks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

LIFTED_M = 0.02
"""A rise above this (metres) counts as picked up: more than settling or a nudge moves an object."""


def moved_objects(goal: Sequence[Sequence[str]]) -> list[str]:
    """The objects a LIBERO goal moves: the first argument of each ``on``/``in`` predicate
    (``[['on', 'akita_black_bowl_1', 'plate_1']]`` -> ``['akita_black_bowl_1']``); none for other goals
    (``open``, ``turnon``, ...)."""
    return [str(pred[1]) for pred in goal if len(pred) == 3 and str(pred[0]).lower() in ("on", "in")]


class ObjectLift:
    """The highest rise of each moved object over one episode, from the privileged replies."""

    def __init__(self) -> None:
        self.rest: dict[str, float] = {}
        self.highest: dict[str, float] = {}

    def observe(self, reply: Mapping[str, Any], *, at_rest: bool) -> None:
        """Read a reply's object heights. ``at_rest`` (the reset's and the settle steps' replies): where
        the objects rest, the reference for the rises; later replies (the policy's chunks): a rise."""
        for name in moved_objects(reply.get("goal", [])):
            pose = reply.get(f"pose/{name}")
            if pose is None:
                continue
            z = float(pose[2])
            if at_rest or name not in self.rest:
                self.rest[name], self.highest[name] = z, 0.0
            else:
                self.highest[name] = max(self.highest[name], z - self.rest[name])

    def result(self) -> dict[str, float]:
        """Object -> highest rise in metres (mm precision); empty when the goal moves no object."""
        return {name: round(rise, 3) for name, rise in self.highest.items()}


def lift_label(lift: Mapping[str, float] | None) -> str:
    """A short phrase for a results row's ``object_lift_m``: ``lifted 0.09 m``, ``never lifted`` (every moved
    object stayed below :data:`LIFTED_M`), or ``""`` when it was not measured or the goal moves nothing."""
    if not lift:
        return ""
    highest = max(lift.values())
    return f"lifted {highest:.2f} m" if highest > LIFTED_M else "never lifted"
