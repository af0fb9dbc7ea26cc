"""The command-by-command life of one LIBERO episode on a simulator process, for evaluation and recording.

Evaluation's env slots (``workers/env/slot.py``) and the demonstration recorder (``demos/recorder.py``)
drive their simulator processes the same way: send one command, collect its reply later (so several
processes run in parallel), through the same phases:

``START`` (``make`` the task when the process holds another one or none, then ``reset`` to the init
state) -> ``SETTLE`` (the ``num_settle_steps`` no-op steps, one ``chunk_step``) -> ``READY`` (the
observation waits for the policy) -> ``STEP`` (the policy's commands, one ``chunk_step``) -> ``READY``
...

:class:`EpisodeProgress` is that machine: where the episode is, the command that moves it on, and what
a reply changes. Its owner hands it the policy's commands, decides when the episode ends, and keeps
the observations and results it reports.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import numpy as np

from rlinf_cosmos3.config.libero_suites import NOOP_ACTION
from rlinf_cosmos3.sim.protocol import reset_fields

if TYPE_CHECKING:
    from rlinf_cosmos3.sim.client import LiberoSimProcess, Reply

NO_ACTIONS = np.zeros((0, len(NOOP_ACTION)))


class Phase(enum.Enum):
    IDLE = "idle"  # no episode
    START = "start"  # make (if needed) and reset
    SETTLE = "settle"  # no-op steps still to run
    READY = "ready"  # observation available, waiting for actions
    STEP = "step"  # actions still to run


class EpisodeProgress:
    """Where one simulator process is in its current episode; ``privileged`` asks every reset and step
    for the scene's ground truth too (scripted policies need it)."""

    def __init__(self, num_settle_steps: int, *, privileged: bool) -> None:
        self.num_settle_steps = num_settle_steps
        self.privileged = privileged
        self.phase = Phase.IDLE
        self.suite, self.task_id, self.init_state_id = "", -1, -1
        self.init_state_task_id: int | None = None
        self.reset_seed: int | None = None
        """The task whose init states the reset loads; None: ``task_id``'s own (no instruction swap)."""
        self.built: tuple[str, int] | None = None
        """(suite, task) of the environment the process holds; ``make`` only when another is needed."""
        self.in_flight: str | None = None
        """The command sent whose reply is not in yet (``make``, ``reset``, ``settle``, ``step``)."""
        self.pending: np.ndarray = NO_ACTIONS
        """Commands still to run in this phase (settle no-ops, or the policy's chunk)."""
        self.steps = 0
        """Simulator steps since the reset, settle steps included."""

    def begin(self, suite: str, task_id: int, init_state_id: int, init_state_task_id: int | None = None,
              reset_seed: int | None = None) -> None:
        """Start an episode (or run it again from its start): ``START``, no step run yet. With
        ``init_state_task_id`` the reset loads that task's init state ``init_state_id`` into ``task_id``'s env;
        with ``reset_seed`` the reset places the scene from that seed (``LiberoSession.reset``)."""
        self.suite, self.task_id, self.init_state_id = suite, task_id, init_state_id
        self.reset_seed = reset_seed
        self.init_state_task_id = None if init_state_task_id == task_id else init_state_task_id
        self.phase, self.in_flight, self.pending, self.steps = Phase.START, None, NO_ACTIONS, 0

    def end(self) -> None:
        """No episode left: ``IDLE``."""
        self.phase, self.pending = Phase.IDLE, NO_ACTIONS

    def forget_env(self) -> None:
        """The process was replaced: the new one holds no environment yet."""
        self.built = None

    def give(self, actions: np.ndarray) -> None:
        """The policy's commands ``[K, 7]`` for a ``READY`` episode: ``STEP``."""
        self.pending, self.phase = np.asarray(actions, dtype=np.float64), Phase.STEP

    def send_start(self, proc: LiberoSimProcess, **make_fields: Any) -> None:
        """``START``: ``make`` the task (with ``make_fields``) if the process holds another, else ``reset``."""
        if self.built != (self.suite, self.task_id):
            proc.send("make", suite=self.suite, task_id=self.task_id, **make_fields)
            self.in_flight = "make"
        else:
            proc.send("reset", **reset_fields(self.init_state_id, privileged=self.privileged,
                                              init_state_task_id=self.init_state_task_id, seed=self.reset_seed))
            self.in_flight = "reset"

    def send_chunk(self, proc: LiberoSimProcess, **chunk_fields: Any) -> None:
        """``SETTLE`` or ``STEP``: the pending commands in one ``chunk_step`` (with ``chunk_fields``)."""
        proc.send("chunk_step", {"actions": self.pending}, privileged=self.privileged, **chunk_fields)
        self.in_flight = self.phase.value

    def on_reply(self, reply: Reply) -> str:
        """Advance with the reply to the command in flight; returns that command.

        ``make``: still ``START`` (the reset follows). ``reset``: the settle no-ops are pending
        (``SETTLE``), or none are (``READY``). ``settle`` / ``step``: the steps run are counted and
        dropped from the pending ones; ``READY`` when none are left. A ``step`` reply may end the
        episode: that is the owner's call.
        """
        cmd, self.in_flight = self.in_flight, None
        if cmd == "make":
            self.built = (self.suite, self.task_id)
        elif cmd == "reset":
            self.pending = np.tile(np.asarray(NOOP_ACTION, dtype=np.float64), (self.num_settle_steps, 1))
            self.phase = Phase.SETTLE if len(self.pending) else Phase.READY
        elif cmd in ("settle", "step"):
            n = int(reply["num_steps"])
            self.steps += n
            self.pending = self.pending[n:]
            if not len(self.pending):
                self.phase = Phase.READY
        else:
            raise RuntimeError(f"a reply, but no command in flight (phase {self.phase.value})")
        return cmd
