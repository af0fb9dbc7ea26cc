"""One pipeline stage of an env worker: its slots, stepped in parallel, and their observation batch.

Parallelism comes from the simulator processes: every round sends one command to each slot that
has work, then collects the replies (each process uses its own core meanwhile). Rounds repeat
until every slot is READY or IDLE, so a chunk step returns only when all the stage's envs can show
an observation again -- including the ones that just started their next episode or were restarted
after a crash.

A stage is driven by one thread at a time (the env worker holds the stage's lock for each call);
different stages of one worker share no state, so they step concurrently.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlinf_cosmos3.config.libero_suites import ACTION_DIM, STATE_DIM
from rlinf_cosmos3.workers.env.results import EpisodeResult
from rlinf_cosmos3.workers.env.slot import SIM_FAILURES, EnvSlot, FinalObservation
from rlinf_cosmos3.workers.observation_keys import (
    ATTEMPTS,
    EPISODE_STEPS,
    INIT_STATE_TASK_IDS,
    MAIN_IMAGES,
    SLOT_IDS,
    STATES,
    TASK_DESCRIPTIONS,
    TASK_IDS,
    TRIAL_IDS,
    WRIST_IMAGES,
)


@dataclass
class StageOutput:
    """What a stage hands back after ``observe`` or ``chunk_step``.

    ``obs`` holds one row per READY slot, ordered by slot position in the stage; the next
    ``chunk_step`` takes actions in this order. ``results`` are episodes that ended since the
    stage last reported (each exactly once). ``done``: no slot of the stage has work left.
    ``started_s``/``finished_s``: ``time.monotonic()`` in the worker when the call began and ended
    (one clock for every process of a host), so a driver can see the stage's simulation time and
    whether the calls of different stages overlapped.
    """

    obs: dict[str, Any]
    results: list[EpisodeResult] = field(default_factory=list)
    done: bool = False
    final_obs: list[FinalObservation] = field(default_factory=list)
    """With ``final_observations``: the last observation of each episode of ``results`` that ran to the cap
    without success (its slot and attempt name it)."""
    started_s: float = 0.0
    finished_s: float = 0.0

    @property
    def num_envs(self) -> int:
        return len(self.obs[SLOT_IDS])


class EnvStage:
    """The slots of one stage; see the module docstring."""

    def __init__(self, stage: int, slots: list[EnvSlot], image_size: int) -> None:
        self.stage = stage
        self.slots = slots
        self.image_size = image_size
        self._unreported: list[EpisodeResult] = []

    @property
    def done(self) -> bool:
        return all(slot.idle for slot in self.slots) and not self._unreported

    def ready_slots(self) -> list[EnvSlot]:
        return [slot for slot in self.slots if slot.ready]

    # ------------------------------------------------------------------ driving
    def start_processes(self) -> None:
        """Start every busy slot's process now, so a broken simulator environment fails at setup."""
        for slot in self.slots:
            if slot.idle:
                continue
            try:
                slot.ensure_process()
            except SIM_FAILURES as exc:
                self._collect(slot.on_failure(exc))

    def run(self) -> None:
        """Rounds of send-to-all / collect-from-all until every slot is READY or IDLE, then reap the
        simulators of slots that went idle (their ``close`` requests were sent as they idled, so
        they exit concurrently and the call waits about one close, not one per slot)."""
        while True:
            busy = [slot for slot in self.slots if slot.wants_request]
            if not busy:
                self.finish_closes()
                return
            sent = []
            for slot in busy:
                try:
                    slot.send_request()
                    sent.append(slot)
                except SIM_FAILURES as exc:
                    self._collect(slot.on_failure(exc))
            for slot in sent:
                try:
                    reply = slot.receive()
                except SIM_FAILURES as exc:
                    self._collect(slot.on_failure(exc))
                    continue
                self._collect(slot.on_reply(reply))

    def step(self, actions: np.ndarray, slot_ids: Any = None) -> None:
        """Give each READY slot its ``[K, 7]`` chunk (rows in :meth:`observe` order) and run."""
        ready = self.ready_slots()
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 3 or actions.shape[0] != len(ready) or actions.shape[2] != ACTION_DIM \
                or (len(ready) and actions.shape[1] == 0):
            raise ValueError(f"stage {self.stage}: expected actions [{len(ready)}, K>=1, {ACTION_DIM}] for its "
                             f"{len(ready)} active envs, got {actions.shape}")
        if not np.isfinite(actions).all():
            bad = sorted({ready[i].slot_id for i in np.argwhere(~np.isfinite(actions))[:, 0]})
            raise ValueError(f"stage {self.stage}: non-finite actions for slots {bad}")
        if slot_ids is not None and [int(s) for s in slot_ids] != [s.slot_id for s in ready]:
            raise ValueError(f"stage {self.stage}: actions are for slots {list(slot_ids)}, "
                             f"but the active slots are {[s.slot_id for s in ready]}")
        for slot, chunk in zip(ready, actions, strict=True):
            slot.give_actions(chunk)
        self.run()

    def _collect(self, result: EpisodeResult | None) -> None:
        if result is not None:
            self._unreported.append(result)

    # ------------------------------------------------------------------ output
    def output(self, started_s: float = 0.0) -> StageOutput:
        """The READY slots' observation batch and the results not reported yet; ``started_s`` is
        when the call that produced them began."""
        results, self._unreported = self._unreported, []
        final_obs = [final for slot in self.slots for final in slot.final_observations]
        for slot in self.slots:
            slot.final_observations = []
        obs = self.observe()
        return StageOutput(obs=obs, results=results, done=self.done, started_s=started_s,
                           finished_s=time.monotonic(), final_obs=final_obs)

    def observe(self) -> dict[str, Any]:
        ready = self.ready_slots()
        size = self.image_size
        if not ready:
            empty_images = np.zeros((0, size, size, 3), dtype=np.uint8)
            return {SLOT_IDS: np.zeros(0, dtype=np.int64), MAIN_IMAGES: empty_images, WRIST_IMAGES: empty_images.copy(),
                    STATES: np.zeros((0, STATE_DIM), dtype=np.float32), TASK_DESCRIPTIONS: [],
                    TASK_IDS: np.zeros(0, dtype=np.int64), TRIAL_IDS: np.zeros(0, dtype=np.int64),
                    INIT_STATE_TASK_IDS: np.zeros(0, dtype=np.int64), EPISODE_STEPS: np.zeros(0, dtype=np.int64),
                    ATTEMPTS: np.zeros(0, dtype=np.int64)}
        return {
            SLOT_IDS: np.asarray([s.slot_id for s in ready], dtype=np.int64),
            MAIN_IMAGES: np.stack([s.obs["main_image"] for s in ready]).astype(np.uint8, copy=False),
            WRIST_IMAGES: np.stack([s.obs["wrist_image"] for s in ready]).astype(np.uint8, copy=False),
            STATES: np.stack([s.obs["state"] for s in ready]).astype(np.float32, copy=False),
            TASK_DESCRIPTIONS: [s.prompt for s in ready],
            TASK_IDS: np.asarray([s.episode.task_id for s in ready if s.episode is not None], dtype=np.int64),
            TRIAL_IDS: np.asarray([s.episode.trial_id for s in ready if s.episode is not None], dtype=np.int64),
            INIT_STATE_TASK_IDS: np.asarray([s.init_state_task_id for s in ready], dtype=np.int64),
            EPISODE_STEPS: np.asarray([s.policy_steps for s in ready], dtype=np.int64),
            ATTEMPTS: np.asarray([s.attempts for s in ready], dtype=np.int64),
        }

    # ------------------------------------------------------------------ shutdown
    def finish_closes(self) -> None:
        """Reap every slot's simulator whose ``close`` request is in flight."""
        for slot in self.slots:
            slot.finish_close()

    def close(self) -> None:
        """Close every slot's simulator, concurrently: all ``close`` requests first, then the replies."""
        for slot in self.slots:
            slot.begin_close()
        self.finish_closes()

    def kill(self) -> None:
        for slot in self.slots:
            slot.kill()
