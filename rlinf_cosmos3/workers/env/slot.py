"""One env slot: a LIBERO simulator process and the episodes assigned to it, as a state machine.

The slot never blocks on its own: :meth:`EnvSlot.send_request` sends the next command and
:meth:`EnvSlot.on_reply` consumes its answer, so :class:`~rlinf_cosmos3.workers.env.stage.EnvStage`
can send to every slot before collecting any reply and the simulators run in parallel.

Episode life (:class:`~rlinf_cosmos3.sim.episode.EpisodeProgress`, shared with the demonstration
recorder): ``START`` (``make`` the task if this process has not built it, then ``reset`` to the
init state) -> ``SETTLE`` (``num_settle_steps`` no-ops) -> ``READY`` (observation out, waiting for an
action chunk) -> ``STEP`` (the chunk, cut at the cap) -> ``READY`` ... until the cap or, with
``stop_on_success``, the first success; then the next assigned episode starts, or the slot goes
``IDLE`` and its process is asked to exit (:meth:`EnvSlot.begin_close`; the stage collects the
replies at the end of the call, so slots that idle in the same chunk step close concurrently). A
process that dies, hangs or fails a command is replaced and the episode re-run from its start;
after ``max_episode_retries`` re-runs it is reported with ``error``. A result is produced exactly
once per assigned episode.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cosmos3.config.env import EnvEvalConfig
from rlinf_cosmos3.config.libero_suites import ACTION_DIM
from rlinf_cosmos3.sim.client import LiberoSimProcess, Reply, SimCommandError, SimProcessError
from rlinf_cosmos3.sim.episode import EpisodeProgress, Phase
from rlinf_cosmos3.sim.object_lift import ObjectLift
from rlinf_cosmos3.workers.env.episodes import Episode
from rlinf_cosmos3.workers.env.prompts import policy_instruction, prompt_from_make_reply
from rlinf_cosmos3.workers.env.results import EpisodeResult, episode_log_line
from rlinf_cosmos3.workers.env.video import EpisodeVideoWriter

logger = logging.getLogger(__name__)

SIM_FAILURES = (SimProcessError, SimCommandError)
"""Failures that cost the episode its attempt (and the process its life), not the whole eval."""
# robosuite raises once its own horizon is passed; keep it beyond every cap.
MIN_SIM_HORIZON = 1000


@dataclass(frozen=True)
class FinalObservation:
    """What a truncated episode (the cap, no success) saw last: the observation after its last command, the one
    no decision was taken on. PPO bootstraps the episode's return from its value."""

    slot_id: int
    attempt: int
    main_image: np.ndarray
    wrist_image: np.ndarray
    prompt: str


class EnvSlot:
    """A simulator process evaluating its queue of episodes one after the other."""

    def __init__(self, slot_id: int, episodes: Sequence[Episode], cfg: EnvEvalConfig, *,
                 keep_process: bool = False) -> None:
        """``keep_process``: an idle slot keeps its simulator (and its built task) for episodes :meth:`assign`
        hands it later (RL's rounds); False closes it as soon as the queue is empty (an eval's slot)."""
        self.slot_id = slot_id
        self.cfg = cfg
        self.keep_process = keep_process
        self.cap = 0  # the current episode's suite's step cap (set with the episode)
        self.max_attempts = 1 + cfg.max_episode_retries
        self.num_reported = 0
        self.num_makes = 0
        self.num_process_starts = 0
        self.proc: LiberoSimProcess | None = None
        self.closing: LiberoSimProcess | None = None  # sent "close", reply not collected yet
        # The ground truth with every reply: the moved objects' heights (object_lift_m of the results).
        self.sim = EpisodeProgress(cfg.num_settle_steps, privileged=True)
        self.lift = ObjectLift()
        self.episode: Episode | None = None
        self.attempts = 0
        self.task_description = ""
        """The built task's own instruction (LIBERO's ``task.language``)."""
        self.prompt = ""
        """What the policy is sent: ``task_description``, or ``env.eval.instruction_override``."""
        self.obs: dict[str, np.ndarray] = {}
        self.final_observations: list[FinalObservation] = []
        """Episodes that ran to the cap without success, with the observation each stopped at, not reported yet
        (only with ``cfg.final_observations``; the stage hands them out with the results)."""
        self.success_once = False
        self.success_at_end = False
        self._queue: deque[Episode] = deque()
        self._video: EpisodeVideoWriter | None = None
        self.num_assigned = 0
        self.assign(episodes)

    def assign(self, episodes: Sequence[Episode]) -> None:
        """Queue ``episodes`` on an idle slot and start the first (none: the slot stays idle)."""
        if not self.idle:
            raise RuntimeError(f"slot {self.slot_id} is busy ({self.phase.value}); episodes go to idle slots")
        # An episode that names no suite (the pure layout functions' default) is of the run's first suite.
        self._queue.extend(e if e.suite else e._replace(suite=self.cfg.resolved_suites()[0]) for e in episodes)
        self.num_assigned += len(episodes)
        self._next_episode()

    def __repr__(self) -> str:
        return f"EnvSlot({self.slot_id}, {self.phase.value}, episode={self.episode}, steps={self.steps})"

    # ------------------------------------------------------------------ state
    @property
    def phase(self) -> Phase:
        return self.sim.phase

    @property
    def steps(self) -> int:
        """Simulator steps of the current episode since its reset, settle steps included."""
        return self.sim.steps

    @property
    def idle(self) -> bool:
        return self.phase is Phase.IDLE

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    @property
    def wants_request(self) -> bool:
        """True while the slot has simulator work to do before it can show an observation."""
        return self.phase in (Phase.START, Phase.SETTLE, Phase.STEP)

    @property
    def policy_steps(self) -> int:
        """Steps of the current episode run on the policy's actions (``steps`` less the settle steps)."""
        return max(0, self.steps - self.cfg.num_settle_steps)

    @property
    def init_state_task_id(self) -> int:
        """The task whose init states the current episode starts from (``env.eval.init_states_from_task``)."""
        assert self.episode is not None
        return self.cfg.init_state_task(self.episode.task_id)

    @property
    def process_id(self) -> int | None:
        proc = self.proc  # read once: a control call may ask while the stage's thread replaces it
        return proc.process_id if proc is not None and proc.alive else None

    # ------------------------------------------------------------------ process
    def ensure_process(self) -> None:
        """Start this slot's simulator process if it has none (blocks ~1 s for the interpreter)."""
        if self.proc is not None:
            return
        self.num_process_starts += 1
        self.proc = LiberoSimProcess(
            name=f"libero-env-slot{self.slot_id}", python=self.cfg.interpreter, timeout_s=self.cfg.sim_timeout_s,
            startup_timeout_s=self.cfg.sim_startup_timeout_s)
        self.sim.forget_env()

    def close(self) -> None:
        """Stop the process politely (SIGTERM/SIGKILL behind it); drop an unfinished video."""
        self.begin_close()
        self.finish_close()

    def begin_close(self) -> None:
        """Send the polite ``close`` without waiting for it; :meth:`finish_close` reaps the process.

        Split in two so a stage whose slots go idle in one chunk step closes their simulators
        concurrently (send all, then collect all) instead of one close round trip after another.
        """
        self._discard_video()
        self.finish_close()  # at most one close in flight per slot
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if self.sim.in_flight is not None or not proc.alive:  # out of step or dead: no polite request
            proc.kill()
            return
        try:
            proc.send("close")
        except SIM_FAILURES as exc:  # the client killed it already; kill() below only reaps
            logger.warning("slot %d: polite close failed: %s", self.slot_id, str(exc).splitlines()[0])
            proc.kill()
            return
        self.closing = proc

    def finish_close(self, timeout_s: float = 10.0) -> None:
        """Collect the reply to :meth:`begin_close` (the child exits on its own after it), then make
        sure its process group is gone (SIGTERM/SIGKILL). No-op without a close in flight."""
        if self.closing is None:
            return
        proc, self.closing = self.closing, None
        try:
            proc.recv(timeout_s=timeout_s)
        except SIM_FAILURES as exc:
            logger.warning("slot %d: polite close failed: %s", self.slot_id, str(exc).splitlines()[0])
        finally:
            proc.kill()

    def kill(self) -> None:
        """Stop the process at once (an aborting worker does not wait for polite replies)."""
        self._discard_video()
        for proc in (self.proc, self.closing):
            if proc is not None:
                proc.kill(grace_s=2.0)
        self.proc = self.closing = None

    # ------------------------------------------------------------------ requests
    def send_request(self) -> None:
        """Send the command that moves the episode forward; raises a SIM_FAILURES error if it cannot."""
        if not self.wants_request:
            raise RuntimeError(f"slot {self.slot_id} has nothing to send in phase {self.phase.value}")
        self.ensure_process()
        assert self.proc is not None and self.episode is not None
        if self.phase is Phase.START:
            size = self.cfg.image_size
            self.sim.send_start(self.proc, camera_height=size, camera_width=size, seed=self.cfg.seed,
                                horizon=max(MIN_SIM_HORIZON, self.cap + 1), hard_reset=True)
            return
        stop = self.phase is Phase.STEP and self.cfg.stop_on_success
        self.sim.send_chunk(self.proc, stop_on_success=stop, return_frames=self.cfg.records_video,
                            frame_stride=self.cfg.video_frame_stride)

    def receive(self) -> Reply:
        """The reply to the request in flight (raises a SIM_FAILURES error if the process fails)."""
        assert self.proc is not None
        return self.proc.recv()

    def give_actions(self, actions: np.ndarray) -> None:
        """Hand a READY slot its chunk ``[K, 7]``; only the steps left under the cap will run."""
        if not self.ready:
            raise RuntimeError(f"slot {self.slot_id} is not waiting for actions (phase {self.phase.value})")
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[1] != ACTION_DIM or len(actions) == 0:
            raise ValueError(f"slot {self.slot_id}: actions must have shape [K>=1, {ACTION_DIM}], got {actions.shape}")
        self.sim.give(actions[: self.cap - self.steps])

    # ------------------------------------------------------------------ replies
    def on_reply(self, reply: Reply) -> EpisodeResult | None:
        """Advance with the reply to the command in flight; the result if the episode ended."""
        assert self.episode is not None
        cmd = self.sim.on_reply(reply)
        if cmd == "make":
            self.num_makes += 1
            self.task_description = prompt_from_make_reply(reply)
            self.prompt = policy_instruction(self.task_description, self.cfg.instruction_override)
            return None  # still START: the reset follows
        self._set_obs(reply)
        self.lift.observe(reply, at_rest=cmd in ("reset", "settle"))
        if cmd == "reset":
            return None
        self._record_frames(reply)
        if cmd == "settle":  # objects settling: success is not the policy's yet
            return None
        successes = np.asarray(reply["successes"], dtype=bool)
        self.success_once |= bool(successes.any())
        self.success_at_end = bool(successes[-1])
        if self.steps >= self.cap or (self.cfg.stop_on_success and self.success_once):
            return self._finish(error=None)
        # The bridge stops a chunk at LIBERO's done (= success); without stop_on_success the rest still runs
        # (the episode stays STEP until its chunk is used up).
        return None

    def on_failure(self, exc: BaseException) -> EpisodeResult | None:
        """The process failed: replace it and re-run the episode, or report it after the last attempt."""
        self.sim.in_flight = None
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        assert self.episode is not None
        logger.warning("slot %d: %s on %s task %d trial %d (attempt %d/%d): %s", self.slot_id, type(exc).__name__,
                       self.episode.suite, self.episode.task_id, self.episode.trial_id, self.attempts, self.max_attempts,
                       first_line)
        self.kill()
        if self.attempts >= self.max_attempts:
            return self._finish(error=f"{type(exc).__name__} on each of {self.attempts} attempt(s); last: {first_line}")
        self._begin_attempt()
        return None

    # ------------------------------------------------------------------ internals
    def _set_obs(self, reply: Reply) -> None:
        self.obs = {"main_image": reply["main_image"], "wrist_image": reply["wrist_image"], "state": reply["state"]}

    def _record_frames(self, reply: Reply) -> None:
        if not self.cfg.records_video or len(reply["main_images"]) == 0:  # no step of the chunk on the stride
            return
        if self._video is None:
            assert self.episode is not None and self.cfg.video_dir is not None
            self._video = EpisodeVideoWriter(self._video_path("running"), self.cfg.video_fps)
        self._video.add(reply["main_images"], reply["wrist_images"])

    def _video_path(self, outcome: str) -> Path:
        assert self.episode is not None and self.cfg.video_dir is not None
        name = f"task{self.episode.task_id:02d}_trial{self.episode.trial_id:02d}_{outcome}.mp4"
        return Path(self.cfg.video_dir) / self.episode.suite / name

    def _discard_video(self) -> None:
        if self._video is not None:
            self._video.discard()
            self._video = None

    def _begin_attempt(self) -> None:
        assert self.episode is not None
        self.attempts += 1
        self.sim.begin(self.episode.suite, self.episode.task_id, self.episode.trial_id,
                       init_state_task_id=self.init_state_task_id, reset_seed=self.episode.reset_seed)
        self.success_once = self.success_at_end = False
        self.obs = {}
        self.lift = ObjectLift()
        self._discard_video()

    def _next_episode(self) -> None:
        if self._queue:
            self.episode = self._queue.popleft()
            self.cap = self.cfg.resolved_max_episode_steps(self.episode.suite)
            self.attempts = 0
            self._begin_attempt()
            return
        self.episode = None
        self.sim.end()
        if self.keep_process:
            return
        # Frees the process's memory and core for the slots still running; the stage collects the
        # reply at the end of its call, together with the other slots that went idle meanwhile.
        self.begin_close()

    def _finish(self, error: str | None) -> EpisodeResult:
        assert self.episode is not None
        video_path = None
        # save_video=failures recorded this episode too; a success's video is dropped here.
        # An episode with an error has no complete video: it is never kept.
        if error is None and self._video is not None and self.cfg.keeps_video(self.success_once):
            final = self._video.finish(self._video_path("success" if self.success_once else "failure"))
            video_path = str(final) if final is not None else None
            self._video = None
        self._discard_video()
        if self.cfg.final_observations and error is None and not self.success_once and self.obs:
            self.final_observations.append(FinalObservation(self.slot_id, self.attempts, self.obs["main_image"],
                                                            self.obs["wrist_image"], self.prompt))
        result = EpisodeResult(
            suite=self.episode.suite, task_id=self.episode.task_id, trial_id=self.episode.trial_id,
            success_once=self.success_once if error is None else False,
            success_at_end=self.success_at_end if error is None else False,
            steps=self.steps if error is None else 0, video_path=video_path, error=error,
            slot_id=self.slot_id, attempts=self.attempts, task_description=self.task_description,
            instruction=self.prompt, init_state_task_id=self.init_state_task_id,
            object_lift_m=self.lift.result() if error is None else None)
        self.num_reported += 1
        logger.log(logging.INFO if error is None else logging.ERROR, "%s", episode_log_line(result))
        self._next_episode()
        return result


def describe(slot: EnvSlot) -> dict[str, Any]:
    """Counters of one slot (for logs and tests)."""
    return {"slot_id": slot.slot_id, "phase": slot.phase.value, "assigned": slot.num_assigned,
            "reported": slot.num_reported, "makes": slot.num_makes, "process_starts": slot.num_process_starts,
            "pid": slot.process_id}
