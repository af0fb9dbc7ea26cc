"""Ground-truth scene state read from a LIBERO environment, for scripted demonstrations.

Runs inside the simulator process. Object poses come from LIBERO's own object-state objects
(the ones its BDDL predicates evaluate), the goal from its parsed BDDL problem.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

_CORNER_SIGNS = np.array(list(itertools.product((-1.0, 1.0), repeat=3)))


def _subtree_bodies(model: Any, root: int) -> set[int]:
    """Body ids of ``root`` and all its descendants (MuJoCo lists parents before children)."""
    bodies = {root}
    for body_id in range(root + 1, model.nbody):
        if int(model.body_parentid[body_id]) in bodies:
            bodies.add(body_id)
    return bodies


def collision_aabb(sim: Any, root_body: int) -> np.ndarray:
    """World-frame axis-aligned box ``[[min xyz], [max xyz]]`` around the collision geoms of a
    body subtree; NaNs if it has none. Uses MuJoCo's per-geom local boxes (``geom_aabb``)."""
    model, data = sim.model, sim.data
    bodies = _subtree_bodies(model, root_body)
    corners = []
    for geom_id in range(model.ngeom):
        if int(model.geom_bodyid[geom_id]) not in bodies:
            continue
        if model.geom_contype[geom_id] == 0 and model.geom_conaffinity[geom_id] == 0:
            continue
        center, half = model.geom_aabb[geom_id, :3], model.geom_aabb[geom_id, 3:]
        local = center + _CORNER_SIGNS * half
        rot = data.geom_xmat[geom_id].reshape(3, 3)
        corners.append(local @ rot.T + data.geom_xpos[geom_id])
    if not corners:
        return np.full((2, 3), np.nan)
    pts = np.concatenate(corners)
    return np.stack([pts.min(axis=0), pts.max(axis=0)])


def collect_privileged(env: Any) -> dict[str, Any]:
    """Goal, robot and per-entity state of a LIBERO ``OffScreenRenderEnv``.

    Returns plain fields (``goal``, ``obj_of_interest``, ``entities`` name -> kind) and arrays
    ``eef_pos``; ``eef_quat`` (x,y,z,w; the hand body, as robosuite's ``robot0_eef_quat``);
    ``grip_site_quat`` (the grip site, the frame the OSC_POSE controller servos); ``gripper_qpos``;
    ``pose/<name>`` (pos + quat x,y,z,w) and, for objects and fixtures, ``aabb/<name>``.
    """
    inner = env.env
    sim = inner.sim
    problem = inner.parsed_problem
    robot = inner.robots[0]
    eef_site = robot.eef_site_id
    reply: dict[str, Any] = {
        "goal": [list(map(str, pred)) for pred in problem["goal_state"]],
        "obj_of_interest": list(map(str, problem.get("obj_of_interest", []))),
        "eef_pos": np.array(sim.data.site_xpos[eef_site], dtype=np.float64),
        "gripper_qpos": np.array([sim.data.qpos[i] for i in robot._ref_gripper_joint_pos_indexes]),
    }
    from robosuite.utils.transform_utils import mat2quat

    hand = sim.model.body_name2id(robot.robot_model.eef_name)
    wxyz = sim.data.body_xquat[hand]
    reply["eef_quat"] = np.array([wxyz[1], wxyz[2], wxyz[3], wxyz[0]], dtype=np.float64)
    reply["grip_site_quat"] = np.asarray(mat2quat(sim.data.site_xmat[eef_site].reshape(3, 3)), dtype=np.float64)
    entities: dict[str, str] = {}
    for name, state in inner.object_states_dict.items():
        if state.object_state_type == "site":
            pos = sim.data.get_site_xpos(name)
            quat = mat2quat(sim.data.get_site_xmat(name))
            entities[name] = "site"
        else:
            body = inner.obj_body_id[name]
            pos = sim.data.body_xpos[body]
            wxyz = sim.data.body_xquat[body]
            quat = np.array([wxyz[1], wxyz[2], wxyz[3], wxyz[0]])
            entities[name] = "fixture" if name in inner.fixtures_dict else "object"
            reply[f"aabb/{name}"] = collision_aabb(sim, body)
        reply[f"pose/{name}"] = np.concatenate([pos, quat]).astype(np.float64)
    reply["entities"] = entities
    return reply
