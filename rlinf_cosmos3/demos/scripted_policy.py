"""A scripted pick-and-place policy for LIBERO, driven by privileged simulator state.

It reads the task's goal from LIBERO's parsed BDDL problem (``[['on', obj, target]]`` or
``[['in', obj, region]]``) and the poses/boxes of objects, and walks through fixed phases:
approach above the object, descend, close, lift, carry above the target, descend, open,
retreat. Commands are LIBERO OSC_POSE deltas in [-1, 1] (robosuite scales 1.0 to 0.05 m and
0.5 rad per step) and the gripper command -1 (open) / +1 (close).

Every position is servoed with a proportional law on the *grip site* (the frame robosuite's
OSC controller moves), the orientation is held pointing down. Grasps: bowl-like objects and plates are
pinched at the rim (one finger inside, one outside); anything else at its centre, with the
fingers closing across the object's narrower horizontal side. Among the candidate grasps, one whose hand
would hit a neighbour of the target where the object is put down is avoided (libero_goal's cabinet
beside the plate). Goals ``in`` a drawer or behind a door are refused: they need it opened first.
Success is never decided here: only the simulator's ``check_success`` says whether a demonstration
worked.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from rlinf_cosmos3.actions.rotation import matrix_to_axis_angle

logger = logging.getLogger(__name__)

POS_SCALE_M = 0.05  # robosuite OSC_POSE: action 1.0 -> 0.05 m per step
ROT_SCALE_RAD = 0.5  # ... and 0.5 rad per step
GRIPPER_OPEN = -1.0
GRIPPER_CLOSE = 1.0
FINGER_TIP_BELOW_SITE_M = 0.012  # Panda fingertips end ~1.1 cm below the grip site
MAX_GRASP_WIDTH_M = 0.07  # Panda fingers open to 8 cm; leave room to come down around the object
FINGER_OPEN_HALF_SPAN_M = 0.045  # open fingers sit ~4 cm either side of the grip site (+ pad)
BOWL_LIKE = ("bowl", "ramekin", "mug", "cup")
FLAT_RIMMED = ("plate",)
"""Too wide to grasp across and too flat to pinch from above the rim: pinched at the rim like a bowl, the
fingertips just above the table (the grasp height's floor), one finger on the plate, one beside it."""
HAND_HALF_LENGTH_M = 0.105  # the Panda hand's collision box, grip-site frame: +-10.5 cm along the closing axis,
HAND_HALF_WIDTH_M = 0.032  # +-3.2 cm across it,
HAND_BOTTOM_ABOVE_SITE_M = 0.026  # from 2.6 cm ...
HAND_TOP_ABOVE_SITE_M = 0.124  # ... to 12.4 cm above the grip site
CLOSED_COMPARTMENTS = ("cabinet", "microwave")
"""Fixtures whose ``*_region`` sites lie behind a drawer or door (LIBERO names them ``<fixture>_top_region``,
``<fixture>_heating_region``, ...): putting something ``in`` one needs it opened first."""


class UnsupportedTaskError(ValueError):
    """The task's goal is not a single pick-and-place predicate this policy can attempt."""


class ScriptPhase(enum.Enum):
    APPROACH = "approach"
    DESCEND = "descend"
    GRASP = "grasp"
    LIFT = "lift"
    CARRY = "carry"
    LOWER = "lower"
    RELEASE = "release"
    RETREAT = "retreat"
    DONE = "done"


@dataclass(frozen=True)
class PickPlaceGoal:
    """``relation`` (on/in) ``obj`` ``target`` as written in the BDDL goal."""

    relation: str
    obj: str
    target: str


def parse_goal(goal: list[list[str]]) -> PickPlaceGoal:
    """LIBERO's parsed goal (e.g. ``[['on', 'akita_black_bowl_1', 'plate_1']]``) -> one pick-place."""
    if len(goal) != 1 or len(goal[0]) != 3 or goal[0][0].lower() not in ("on", "in"):
        raise UnsupportedTaskError(f"only a single 'on'/'in' goal is supported, got {goal}")
    relation, obj, target = goal[0]
    if relation.lower() == "in" and target.endswith("_region") and any(f in target for f in CLOSED_COMPARTMENTS):
        raise UnsupportedTaskError(f"goal {goal[0]}: {target!r} is inside a drawer/door of a fixture that must be "
                                   "opened first; this pick-and-place policy does not open it")
    return PickPlaceGoal(relation.lower(), obj, target)


@dataclass
class ScriptedPolicyConfig:
    """Gains, speeds and margins (metres, action units). Defaults were tuned on libero_spatial/object."""

    pos_gain: float = 2.0
    max_speed: float = 1.0
    rot_gain: float = 1.0
    approach_height: float = 0.08
    carry_clearance: float = 0.06
    place_clearance: float = 0.02
    hand_margin: float = 0.01
    """Metres. A grasp whose hand would come closer than this to a neighbour of the target where the object
    is put down is chosen only if every grasp would (libero_goal: the cabinet beside the plate)."""
    rim_inset: float = 0.012
    grasp_depth: float = 0.03
    reach_tol: float = 0.008
    enough_clearance: float = 0.025
    stall_tol: float = 0.003
    stall_window: int = 3
    coarse_tol: float = 0.02
    grasp_steps: int = 10
    release_steps: int = 8
    retreat_height: float = 0.08
    phase_timeout: int = 60
    max_regrasps: int = 2
    noise_std: float = 0.0
    noise_period: int = 1
    """Noise bursts start every ``noise_period`` commands (1: noise on every command)."""
    noise_burst: int = 1
    """Commands per burst that get ``noise_std``. With action chunks a label answers only what the chunk's
    first frame shows; rare bursts leave most chunks free of perturbations they cannot see coming."""
    place_jitter: float = 0.0
    """Metres. Carry the object to a point drawn uniformly within this radius of the place point (once per
    plan), then lower diagonally onto the place point: demonstrations that show the object held beside
    its target and how to get over and down onto it - states a policy reaches when it is a little off,
    which straight-down demonstrations never show. Every command stays the scripted controller's own."""
    approach_jitter: float = 0.0
    """Metres. Approach a point drawn uniformly within this radius of the point above the grasp (once per
    plan), then descend diagonally onto the grasp: demonstrations of coming down onto the grasp from a
    little off to the side - where a policy that misjudges the object's position by a centimetre or two
    is, and where straight-down demonstrations never show how to still land the fingers on the grasp."""


def _down_rotation(yaw: float) -> np.ndarray:
    """Grip-site orientation pointing down with the finger-closing axis (site x) at ``yaw`` in the
    table plane; yaw 0 closes the fingers along world +y, as the robot's home pose does."""
    base = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
    return Rotation.from_euler("z", yaw).as_matrix() @ base


class ScriptedPickPlace:
    """Phase machine producing one 7-D LIBERO command per call of :meth:`act`."""

    def __init__(self, goal: list[list[str]], config: ScriptedPolicyConfig | None = None, seed: int = 0) -> None:
        self.goal = parse_goal(goal)
        self.cfg = config or ScriptedPolicyConfig()
        self.rng = np.random.default_rng(seed)
        self.phase = ScriptPhase.APPROACH
        self.phase_steps = 0
        self.regrasps = 0
        self._plan: dict[str, Any] = {}
        self._eef_history: list[np.ndarray] = []
        self.commands = 0
        """Commands returned by :meth:`act` so far (the noise bursts count them)."""
        self.last_clean_action: np.ndarray | None = None
        """The last command of :meth:`act` before ``noise_std`` was added (clipped alike): what a
        recording stores as the label when the executed command carries noise (DART-style)."""

    @property
    def done(self) -> bool:
        return self.phase is ScriptPhase.DONE

    # ------------------------------------------------------------------ scene geometry
    @staticmethod
    def _box(priv: dict[str, Any], name: str) -> np.ndarray | None:
        box = priv.get(f"aabb/{name}")
        return None if box is None or np.isnan(box).any() else np.asarray(box)

    def _support_top(self, priv: dict[str, Any]) -> tuple[np.ndarray, float]:
        """(xy where the object's body should end up, z of the surface it rests on / drops onto)."""
        target = self.goal.target
        kind = priv["entities"].get(target)
        if kind is None:
            raise UnsupportedTaskError(f"goal target {target!r} not in the scene")
        pose = np.asarray(priv[f"pose/{target}"])
        if kind != "site":
            box = self._box(priv, target)
            top = float(box[1, 2]) if box is not None else float(pose[2])
            return pose[:2].copy(), top
        # A region: the top of the object it belongs to (e.g. basket_1 for basket_1_contain_region).
        parents = [n for n, k in priv["entities"].items() if k != "site" and target.startswith(n + "_")]
        top = float(pose[2])
        for parent in parents:
            box = self._box(priv, parent)
            if box is not None:
                top = max(top, float(box[1, 2]))
        return pose[:2].copy(), top

    def _clearance(self, priv: dict[str, Any], point: np.ndarray, yaw: float) -> float:
        """Smallest table-plane distance (capped at 5 cm) from the open fingertips at ``point`` to
        any other object or fixture that reaches above the fingertips."""
        axis = _down_rotation(yaw)[:, 0]
        fingers = [point + s * FINGER_OPEN_HALF_SPAN_M * axis for s in (-1.0, 1.0)]
        tip_z = point[2] - FINGER_TIP_BELOW_SITE_M
        best = 0.05
        for name, kind in priv["entities"].items():
            if kind == "site" or name == self.goal.obj:
                continue
            box = self._box(priv, name)
            if box is None or box[1, 2] < tip_z:
                continue
            for f in fingers:
                gap = np.maximum(np.maximum(box[0, :2] - f[:2], f[:2] - box[1, :2]), 0.0)
                best = min(best, float(np.linalg.norm(gap)))
        return best

    def _hand_gap(self, priv: dict[str, Any], site: np.ndarray, yaw: float) -> float:
        """Smallest table-plane gap (capped at 5 cm) between the hand's collision box with the grip site at
        ``site`` and any other object or fixture box it overlaps in height. Negative gaps are not measured:
        0 means the hand would hit something (e.g. a cabinet beside the target while lowering onto it)."""
        rot = _down_rotation(yaw)
        half = HAND_HALF_LENGTH_M * np.abs(rot[:2, 0]) + HAND_HALF_WIDTH_M * np.abs(rot[:2, 1])
        lo_z, hi_z = site[2] + HAND_BOTTOM_ABOVE_SITE_M, site[2] + HAND_TOP_ABOVE_SITE_M
        skip = {self.goal.obj, self.goal.target}
        best = 0.05
        for name, kind in priv["entities"].items():
            if kind == "site" or name in skip or self.goal.target.startswith(name + "_"):
                continue
            box = self._box(priv, name)
            if box is None or box[1, 2] < lo_z or box[0, 2] > hi_z:
                continue
            gap = np.maximum(np.maximum(box[0, :2] - (site[:2] + half), (site[:2] - half) - box[1, :2]), 0.0)
            best = min(best, float(np.linalg.norm(gap)))
        return best

    def _plan_grasp(self, priv: dict[str, Any]) -> None:
        """Choose the grasp point, gripper yaw and the heights used by the later phases."""
        obj = self.goal.obj
        box = self._box(priv, obj)
        if box is None:
            raise UnsupportedTaskError(f"no collision box for {obj!r}")
        lo, hi = box
        center = (lo + hi) / 2.0
        height = float(hi[2] - lo[2])
        extent = hi[:2] - lo[:2]
        eef = np.asarray(priv["eef_pos"])
        candidates: list[tuple[np.ndarray, float]] = []
        if any(tag in obj for tag in (*BOWL_LIKE, *FLAT_RIMMED)):
            # pinch the rim, fingers closing radially: one inside the bowl, one outside
            radius = float(min(extent)) / 2.0 - self.cfg.rim_inset
            z = hi[2] - self.cfg.grasp_depth * 0.7
            for theta in (np.pi / 2, -np.pi / 2, 0.0, np.pi):
                point = np.array([center[0] + radius * np.cos(theta), center[1] + radius * np.sin(theta), z])
                yaw = theta % np.pi - np.pi / 2  # closing axis radial, yaw in [-90°, 90°)
                candidates.append((point, yaw))
        else:
            grasp_z = max(lo[2] + height / 2.0, hi[2] - self.cfg.grasp_depth - 0.005)
            point = np.array([center[0], center[1], grasp_z])
            # yaw 0 closes the fingers along y, yaw 90° along x; only where the object fits between them
            fits = [yaw for yaw, width in ((0.0, extent[1]), (np.pi / 2, extent[0])) if width < MAX_GRASP_WIDTH_M]
            candidates = [(point, yaw) for yaw in (fits or [0.0 if extent[1] <= extent[0] else np.pi / 2])]
        target_xy, support_top = self._support_top(priv)
        obj_xy = np.asarray(priv[f"pose/{obj}"])[:2]

        def hand_blocked_at_place(point: np.ndarray, yaw: float) -> bool:
            """The hand would hit a neighbour of the target where this grasp puts it down (the object's
            body on the target centre): the carry would stall against it, so another grasp is better."""
            grip_above_bottom = max(float(point[2]), lo[2] + FINGER_TIP_BELOW_SITE_M + 0.003) - lo[2]
            place_z = support_top + grip_above_bottom + self.cfg.place_clearance
            site = np.array([*(target_xy + point[:2] - obj_xy), place_z])
            return self._hand_gap(priv, site, yaw) < self.cfg.hand_margin

        # a hand that fits where the object goes down first; then enough clearance (capped); then little
        # wrist rotation; then the nearer point
        grasp, yaw = max(candidates, key=lambda c: -float(hand_blocked_at_place(c[0], c[1]))
                         + min(self._clearance(priv, c[0], c[1]), self.cfg.enough_clearance)
                         - 0.005 * abs(c[1]) - 0.01 * float(np.linalg.norm(c[0][:2] - eef[:2])))
        grasp = grasp.copy()
        grasp[2] = max(grasp[2], lo[2] + FINGER_TIP_BELOW_SITE_M + 0.003)
        logger.debug("grasp %s at %s, yaw %.0f°, clearance %.3f", obj, np.round(grasp, 3), np.degrees(yaw),
                     self._clearance(priv, grasp, yaw))
        self._plan = {
            "grasp": grasp,
            "rot": _down_rotation(yaw),
            "obj_start_z": float(np.asarray(priv[f"pose/{obj}"])[2]),
            "grip_above_bottom": float(grasp[2] - lo[2]),
            "target_xy": target_xy,
            "support_top": support_top,
            "carry_offset_xy": self._disc_point(self.cfg.place_jitter),
            # drawn after the carry offset: place-jitter-only recordings keep their draws
            "approach_offset_xy": self._disc_point(self.cfg.approach_jitter),
        }

    def _disc_point(self, radius: float) -> np.ndarray:
        """A point drawn uniformly from the disc of ``radius`` (no draw at 0: noise-only runs stay as before)."""
        if radius <= 0:
            return np.zeros(2)
        r, theta = radius * np.sqrt(self.rng.uniform()), self.rng.uniform(0.0, 2 * np.pi)
        return np.array([r * np.cos(theta), r * np.sin(theta)])

    # ------------------------------------------------------------------ control
    def _servo(self, priv: dict[str, Any], target: np.ndarray, gripper: float) -> np.ndarray:
        """Proportional position/orientation command toward ``target``, speed-limited."""
        eef = np.asarray(priv["eef_pos"])
        v = (target - eef) / POS_SCALE_M * self.cfg.pos_gain
        speed = float(np.linalg.norm(v))
        if speed > self.cfg.max_speed:
            v *= self.cfg.max_speed / speed
        current = Rotation.from_quat(np.asarray(priv["grip_site_quat"])).as_matrix()
        err = matrix_to_axis_angle(self._plan["rot"] @ current.T)
        w = np.clip(err / ROT_SCALE_RAD * self.cfg.rot_gain, -1.0, 1.0)
        action = np.concatenate([v, w, [gripper]])
        action[:6] = np.clip(action[:6], -1.0, 1.0)
        self.last_clean_action = action.copy()
        if self.cfg.noise_std > 0 and (self.commands - 1) % self.cfg.noise_period < self.cfg.noise_burst:
            action[:6] = np.clip(action[:6] + self.rng.normal(0.0, self.cfg.noise_std, size=6), -1.0, 1.0)
        return action

    def _stalled(self, target: np.ndarray, within: float) -> bool:
        """The hand has (nearly) stopped short of ``target`` but is within ``within`` of it: it is
        blocked (fingers on a rim, object on its support), so waiting longer would not help."""
        w = self.cfg.stall_window
        if self.phase_steps <= w or len(self._eef_history) <= w:
            return False
        recent = float(np.linalg.norm(self._eef_history[-1] - self._eef_history[-1 - w]))
        return recent < self.cfg.stall_tol and float(np.linalg.norm(self._eef_history[-1] - target)) < within

    def _goto(self, phase: ScriptPhase) -> None:
        logger.debug("phase %s -> %s after %d steps", self.phase.value, phase.value, self.phase_steps)
        self.phase = phase
        self.phase_steps = 0

    def _reached(self, priv: dict[str, Any], target: np.ndarray, tol: float) -> bool:
        return float(np.linalg.norm(np.asarray(priv["eef_pos"]) - target)) < tol

    def act(self, priv: dict[str, Any]) -> np.ndarray:
        """Next command for the scene state ``priv`` (a ``LiberoSimProcess.privileged()`` reply)."""
        cfg = self.cfg
        if not self._plan:
            self._plan_grasp(priv)
        plan = self._plan
        self.commands += 1
        self.phase_steps += 1
        eef = np.asarray(priv["eef_pos"])
        self._eef_history = [*self._eef_history[-9:], eef.copy()]
        obj_pose = np.asarray(priv[f"pose/{self.goal.obj}"])
        grasp = plan["grasp"]
        above = grasp + np.array([*plan["approach_offset_xy"], cfg.approach_height])

        if self.phase is ScriptPhase.APPROACH:
            if self._reached(priv, above, cfg.coarse_tol) or self.phase_steps > cfg.phase_timeout:
                self._goto(ScriptPhase.DESCEND)
            return self._servo(priv, above, GRIPPER_OPEN)
        if self.phase is ScriptPhase.DESCEND:
            if (self._reached(priv, grasp, cfg.reach_tol) or self._stalled(grasp, cfg.coarse_tol)
                    or self.phase_steps > cfg.phase_timeout // 2):
                self._goto(ScriptPhase.GRASP)
            return self._servo(priv, grasp, GRIPPER_OPEN)
        if self.phase is ScriptPhase.GRASP:
            if self.phase_steps >= cfg.grasp_steps:
                plan["grip_offset_xy"] = eef[:2] - obj_pose[:2]
                plan["carry_z"] = max(plan["support_top"], plan["obj_start_z"]) + plan["grip_above_bottom"] \
                    + cfg.carry_clearance
                self._goto(ScriptPhase.LIFT)
            return self._servo(priv, grasp, GRIPPER_CLOSE)
        if self.phase is ScriptPhase.LIFT:
            lift_to = np.array([grasp[0], grasp[1], plan["carry_z"]])
            lifted = obj_pose[2] - plan["obj_start_z"]
            if eef[2] - grasp[2] > 0.05 and lifted < 0.02:
                return self._regrasp(priv, "object did not come up")
            if self._reached(priv, lift_to, cfg.coarse_tol) or self.phase_steps > cfg.phase_timeout:
                self._goto(ScriptPhase.CARRY)
            return self._servo(priv, lift_to, GRIPPER_CLOSE)
        place_xy = plan["target_xy"] + plan.get("grip_offset_xy", np.zeros(2))
        if self.phase is ScriptPhase.CARRY:
            carry_xy = place_xy + plan["carry_offset_xy"]
            carry_to = np.array([carry_xy[0], carry_xy[1], plan["carry_z"]])
            if obj_pose[2] - plan["obj_start_z"] < 0.01:
                return self._regrasp(priv, "object dropped while carrying")
            if self._reached(priv, carry_to, cfg.reach_tol * 1.5) or self.phase_steps > cfg.phase_timeout * 2:
                self._goto(ScriptPhase.LOWER)
            return self._servo(priv, carry_to, GRIPPER_CLOSE)
        place_z = plan["support_top"] + plan["grip_above_bottom"] + cfg.place_clearance
        if self.phase is ScriptPhase.LOWER:
            lower_to = np.array([place_xy[0], place_xy[1], place_z])
            if (self._reached(priv, lower_to, cfg.reach_tol) or self._stalled(lower_to, 2 * cfg.coarse_tol)
                    or self.phase_steps > cfg.phase_timeout // 2):
                self._goto(ScriptPhase.RELEASE)
            return self._servo(priv, lower_to, GRIPPER_CLOSE)
        if self.phase is ScriptPhase.RELEASE:
            if self.phase_steps >= cfg.release_steps:
                plan["release_pos"] = eef.copy()
                self._goto(ScriptPhase.RETREAT)
            return self._servo(priv, np.array([place_xy[0], place_xy[1], place_z]), GRIPPER_OPEN)
        retreat_to = plan.get("release_pos", eef) + np.array([0.0, 0.0, cfg.retreat_height])
        if self.phase is ScriptPhase.RETREAT:
            if self._reached(priv, retreat_to, cfg.coarse_tol) or self.phase_steps > cfg.phase_timeout // 2:
                self._goto(ScriptPhase.DONE)
            return self._servo(priv, retreat_to, GRIPPER_OPEN)
        return self._servo(priv, retreat_to, GRIPPER_OPEN)

    def _regrasp(self, priv: dict[str, Any], why: str) -> np.ndarray:
        """Open and start over from a fresh plan (bounded by ``max_regrasps``), else give up."""
        self.regrasps += 1
        if self.regrasps > self.cfg.max_regrasps:
            logger.debug("giving up: %s", why)
            self._goto(ScriptPhase.DONE)
        else:
            logger.debug("regrasp %d: %s", self.regrasps, why)
            self._plan = {}
            self._plan_grasp(priv)
            self._goto(ScriptPhase.APPROACH)
        eef = np.asarray(priv["eef_pos"])
        return self._servo(priv, eef + np.array([0.0, 0.0, 0.02]), GRIPPER_OPEN)
