"""One LIBERO task environment inside the simulator process (.venv-libero, numpy < 2).

Everything that knows LIBERO's and robosuite's APIs lives here, so the server loop only moves
messages. Imports LIBERO lazily: the module itself needs only numpy, which keeps it importable (and
its pure helpers testable) from the main environment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from rlinf_cosmos3.config.libero_suites import ACTION_DIM
from rlinf_cosmos3.sim.images import rotate_180
from rlinf_cosmos3.sim.repeated_forward import ForwardCounts, repeated_forward_skipped

logger = logging.getLogger(__name__)

MAIN_CAMERA = "agentview"
WRIST_CAMERA = "robot0_eye_in_hand"


class SessionError(RuntimeError):
    """A command cannot run in the session's current state (e.g. step before make/reset)."""


class LiberoSession:
    """Builds, resets and steps one LIBERO task; formats observations the project's way."""

    def __init__(self) -> None:
        self._env: Any = None
        self._task_suite: Any = None
        self._init_states: np.ndarray | None = None
        self._task_language = ""
        self._has_reset = False
        self._suite = ""
        self._task_id = -1
        self._last_raw: dict[str, np.ndarray] = {}
        self._steps_since_reset = 0  # which steps' frames a chunk with a frame stride returns
        self._skip_repeated_forward = True
        self.forward_counts = ForwardCounts()  # robosuite's forward calls while stepping, and those skipped

    # ------------------------------------------------------------------ lifecycle
    def make(self, suite: str, task_id: int, camera_height: int = 256, camera_width: int = 256,
             seed: int = 0, horizon: int = 1000, hard_reset: bool = True,
             skip_repeated_forward: bool = True) -> dict[str, Any]:
        """Build the task's OffScreenRenderEnv (closing a previous one) and load its init states.

        ``skip_repeated_forward``: step without the controller's repeat of each substep's forward pass
        (``sim/repeated_forward.py``; bit-identical outputs); False steps robosuite exactly as it ships."""
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        self.close()
        benchmarks = benchmark.get_benchmark_dict()
        if suite not in benchmarks:
            raise SessionError(f"unknown LIBERO suite {suite!r}; known: {sorted(benchmarks)}")
        task_suite = benchmarks[suite]()
        num_tasks = task_suite.get_num_tasks()
        if not 0 <= task_id < num_tasks:
            raise SessionError(f"task_id {task_id} out of range for {suite} ({num_tasks} tasks)")
        task = task_suite.get_task(task_id)
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        self._env = OffScreenRenderEnv(
            bddl_file_name=bddl,
            camera_heights=camera_height,
            camera_widths=camera_width,
            camera_names=[MAIN_CAMERA, WRIST_CAMERA],
            horizon=horizon,
            hard_reset=hard_reset,
        )
        self._env.seed(seed)
        self._skip_repeated_forward = bool(skip_repeated_forward)
        self._task_suite = task_suite
        self._init_states = np.asarray(task_suite.get_task_init_states(task_id))
        # The policy prompt: LIBERO's task.language (what LIBERO's datasets and both reference
        # evaluations use), not the env's BDDL wording ("pick the akita black bowl ...").
        self._task_language = str(task.language)
        self._has_reset = False
        self._suite, self._task_id = suite, task_id
        return {
            "task": self._task_language,
            "language": self._task_language,
            "bddl_language": str(self._env.language_instruction),
            "task_name": task.name,
            "num_init_states": int(len(self._init_states)),
            "num_tasks": int(num_tasks),
        }

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
        self._has_reset = False

    def _require_env(self) -> Any:
        if self._env is None:
            raise SessionError("no environment: send 'make' first")
        return self._env

    def _require_reset(self) -> Any:
        env = self._require_env()
        if not self._has_reset:
            raise SessionError("environment not reset: send 'reset' first")
        return env

    # ------------------------------------------------------------------ observations
    @staticmethod
    def format_obs(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """robosuite observation -> main/wrist images (rotated 180°) and the 8-D state."""
        from robosuite.utils.transform_utils import quat2axisangle

        axis_angle = quat2axisangle(np.array(raw["robot0_eef_quat"], dtype=np.float64))
        state = np.concatenate([raw["robot0_eef_pos"], axis_angle, raw["robot0_gripper_qpos"]])
        return {
            "main_image": rotate_180(raw[f"{MAIN_CAMERA}_image"]),
            "wrist_image": rotate_180(raw[f"{WRIST_CAMERA}_image"]),
            "state": state.astype(np.float32),
        }

    def _init_states_of(self, init_state_task_id: int | None) -> np.ndarray:
        """The built task's fixed init states, or those of task ``init_state_task_id`` of the same suite
        (an instruction swap). The caller vouches that both tasks share one scene (``env.eval`` allows
        swaps in libero_goal only); here only the state vector's length is checked, as one of another
        length cannot load at all."""
        assert self._init_states is not None
        if init_state_task_id is None or init_state_task_id == self._task_id:
            return self._init_states
        num_tasks = self._task_suite.get_num_tasks()
        if not 0 <= init_state_task_id < num_tasks:
            raise SessionError(f"init_state_task_id {init_state_task_id} out of range for {self._suite} "
                               f"({num_tasks} tasks)")
        states = np.asarray(self._task_suite.get_task_init_states(init_state_task_id))
        if states.shape[1:] != self._init_states.shape[1:]:
            raise SessionError(f"task {init_state_task_id}'s init states have shape {states.shape[1:]}, task "
                               f"{self._task_id}'s {self._init_states.shape[1:]}: not the same scene")
        return states

    def reset(self, init_state_id: int, init_state_task_id: int | None = None,
              seed: int | None = None) -> dict[str, Any]:
        """env.reset() then LIBERO's fixed init state number ``init_state_id`` (as LIBERO's eval) of the
        built task, or of task ``init_state_task_id`` (instruction swap: the goal stays the built task's).

        ``seed``: reseed first. The init state sets the joints only; the furniture without joints (cabinet,
        stove, ...) is placed anew at each hard reset from numpy's global RNG, so without a seed the scene
        depends on how many episodes this process ran before (LIBERO's own eval behaves so)."""
        env = self._require_env()
        states = self._init_states_of(init_state_task_id)
        if not 0 <= init_state_id < len(states):
            raise SessionError(f"init_state_id {init_state_id} out of range ({len(states)} states)")
        if seed is not None:
            env.seed(seed)
        env.reset()
        raw = env.set_init_state(states[init_state_id])
        self._has_reset = True
        self._steps_since_reset = 0
        self._last_raw = raw
        return {**self.format_obs(raw), "task": self._task_language, "success": bool(env.check_success())}

    def raw_observation(self) -> dict[str, np.ndarray]:
        """The last camera images exactly as robosuite rendered them (not rotated), for checks."""
        self._require_reset()
        return {
            "main_image": np.ascontiguousarray(self._last_raw[f"{MAIN_CAMERA}_image"]),
            "wrist_image": np.ascontiguousarray(self._last_raw[f"{WRIST_CAMERA}_image"]),
        }

    # ------------------------------------------------------------------ stepping
    def _check_action(self, action: np.ndarray) -> np.ndarray:
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (ACTION_DIM,):
            raise SessionError(f"action must have shape ({ACTION_DIM},), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise SessionError(f"action has non-finite values: {action}")
        return action

    def step(self, action: np.ndarray) -> dict[str, Any]:
        """One control step (20 Hz); success is LIBERO's ``check_success``."""
        env = self._require_reset()
        raw, reward, done, _info = self._env_step(env, self._check_action(action))
        self._last_raw = raw
        return {**self.format_obs(raw), "reward": float(reward), "done": bool(done),
                "success": bool(env.check_success())}

    def chunk_step(self, actions: np.ndarray, stop_on_success: bool = False,
                   return_frames: bool = False, frame_stride: int = 1) -> dict[str, Any]:
        """Run a chunk of actions in one round trip; stops early at ``done`` (horizon) and, if
        asked, at the first success. Per-step flags cover only the steps actually executed.

        Without ``return_frames`` only the chunk's last step renders its cameras: the policy sees
        nothing in between, and with software EGL rendering two 256x256 views is most of a LIBERO
        step's cost (docs/benchmarks.md, "Rendering only the observed step"). The last step's images
        are bit-identical to rendering every step
        (robosuite samples the cameras at the same sub-step either way; tested). A chunk that ends
        early (success or done) on a step that was not rendered renders its cameras after that step
        instead -- an episode's final view, never sent to the policy.

        ``frame_stride`` k: with ``return_frames``, only every k-th step since the reset (counted over
        chunks, from the reset's first step) renders and returns its frames -- a video at 1/k of the
        control rate for 1/k of the rendering."""
        if frame_stride < 1:
            raise SessionError(f"frame_stride must be >= 1, got {frame_stride}")
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[1] != ACTION_DIM:
            raise SessionError(f"actions must have shape (K, {ACTION_DIM}), got {actions.shape}")
        if len(actions) == 0:
            raise SessionError("chunk_step needs at least one action")
        env = self._require_reset()
        rewards, successes, dones, frames = [], [], [], []
        raw: dict[str, np.ndarray] = {}
        rendered = False
        for index, action in enumerate(actions):
            framed = return_frames and self._steps_since_reset % frame_stride == 0
            rendered = framed or index == len(actions) - 1
            with nullcontext() if rendered else self._cameras_held():
                raw, reward, done, _info = self._env_step(env, self._check_action(action))
            self._steps_since_reset += 1
            success = bool(env.check_success())
            rewards.append(float(reward))
            successes.append(success)
            dones.append(bool(done))
            if framed:
                obs = self.format_obs(raw)
                frames.append((obs["main_image"], obs["wrist_image"]))
            if done or (stop_on_success and success):
                break
        if not rendered:
            raw = {**raw, **self._render_cameras_now()}
        self._last_raw = raw
        out = self.format_obs(raw)
        reply = {
            "main_image": out["main_image"], "wrist_image": out["wrist_image"], "state": out["state"],
            "rewards": np.asarray(rewards, dtype=np.float32),
            "successes": np.asarray(successes, dtype=bool),
            "dones": np.asarray(dones, dtype=bool),
            "num_steps": len(rewards), "success": successes[-1], "done": dones[-1],
        }
        if return_frames:  # [0, H, W, 3] when no step of this chunk fell on the stride
            for view, key in enumerate(("main_images", "wrist_images")):
                reply[key] = np.stack([f[view] for f in frames]) if frames else out["main_image"][None][:0]
        return reply

    def _env_step(self, env: Any, action: np.ndarray) -> tuple[Any, ...]:
        """robosuite's ``env.step``, without the repeated forward passes unless the session was made so."""
        if not self._skip_repeated_forward:
            return env.step(action)
        with repeated_forward_skipped(env.sim, self.forward_counts):
            return env.step(action)

    # ------------------------------------------------------------------ rendering
    def _camera_observables(self) -> list[Any]:
        """robosuite's observables of the two cameras (``<camera>_image``)."""
        observables = self._require_env().env._observables
        return [observables[f"{camera}_image"] for camera in (MAIN_CAMERA, WRIST_CAMERA)]

    @contextmanager
    def _cameras_held(self) -> Iterator[None]:
        """The camera observables answer with the image they hold instead of rendering.

        Their sensor function is swapped, nothing else: robosuite's sampling bookkeeping (when a
        camera samples within a step) runs exactly as usual, so the next rendered step samples at
        the very sub-step it would have."""
        observables = self._camera_observables()
        sensors = [o._sensor for o in observables]
        try:
            for observable, sensor in zip(observables, sensors, strict=True):
                held = observable._current_observed_value

                def hold(_obs_cache: dict, held: np.ndarray = held) -> np.ndarray:
                    return held

                hold.__modality__ = sensor.__modality__  # robosuite's @sensor marker
                observable._sensor = hold
            yield
        finally:
            for observable, sensor in zip(observables, sensors, strict=True):
                observable._sensor = sensor

    def _render_cameras_now(self) -> dict[str, np.ndarray]:
        """The cameras rendered at the current state, without touching robosuite's sampling state."""
        env = self._require_env().env
        return {o.name: np.asarray(o._sensor(env._obs_cache)) for o in self._camera_observables()}

    # ------------------------------------------------------------------ privileged state
    def privileged(self) -> dict[str, Any]:
        """Ground-truth scene state for scripted policies: the goal predicates from the parsed
        BDDL problem, the robot's eef/gripper, every object's and region's pose (quats x,y,z,w)
        and every object's world-frame collision bounding box."""
        from rlinf_cosmos3.sim.libero_privileged import collect_privileged

        return collect_privileged(self._require_reset())
