"""The LIBERO env worker: a Ray actor holding ``S`` independent stages of ``E/(W*S)`` env slots.

Rank ``w`` of a ``WorkerGroup`` of ``W`` workers evaluates the episodes
:func:`~rlinf_cosmos3.workers.env.episodes.worker_plan` gives it. The pipelined eval runner drives
each stage on its own: ``observe(s)``, then ``chunk_step(s, actions)`` with the policy's
``[N, K, 7]`` chunk for the stage's ``N`` active envs, until the returned ``done``; meanwhile
another stage's request is being served. Every call returns a :class:`StageOutput` whose
``results`` are the episodes that ended since the stage last reported.

The actor is threaded (:func:`start_env_workers` gives it ``S + 1`` threads) so the ``S`` stages
step concurrently: while stage 0's chunk step waits on its simulators' pipes (select/read, no GIL
held), stage 1's runs too, and one spare thread keeps control calls (``done``, ``stats``, ``close``)
from queueing behind them. Each stage owns its slots (processes, episode queues, videos, unreported
results) and a lock held for the whole of a call on it, so per-stage calls touch disjoint state;
the worker-wide flags (failed, closed) sit behind one more lock. ``setup`` and ``close`` take every
stage's lock, so they never pull a process from under a running call.

No simulator process outlives the worker: ``close()`` stops them; any exception escaping a method
kills them before it propagates (the worker is unusable afterwards; a stage that is mid-call is
killed as soon as that call returns); if the actor process itself dies, the kernel closes its ends
of the simulators' pipes and each simulator exits on the EOF.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from rlinf_cosmos3.cluster import Worker, WorkerGroup
from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.config.env import EnvEvalConfig
from rlinf_cosmos3.workers.env.episodes import Episode, eval_episodes, worker_plan
from rlinf_cosmos3.workers.env.slot import EnvSlot, describe
from rlinf_cosmos3.workers.env.stage import EnvStage, StageOutput

if TYPE_CHECKING:
    from rlinf_cosmos3.cluster import Cluster


class LiberoEnvWorker(Worker):
    """See the module docstring. Start the group with :func:`start_env_workers` (it makes the actor threaded)."""

    def __init__(self, cfg: EnvEvalConfig, pipeline_stage_num: int = 1,
                 episodes: Sequence[Episode] | None = None, keep_processes: bool = False) -> None:
        """``episodes``: the ones to run (a resumed eval's missing ones); None: every episode of ``cfg``.
        ``keep_processes``: idle slots keep their simulators for the episodes :meth:`assign` hands out later
        (RL's rounds); False: a slot's simulator exits once its last episode is done (an eval)."""
        try:
            self.cfg = cfg.validate(pipeline_stage_num)
        except ConfigError as err:
            # ConfigError's constructor takes (field, problem, fix), so Ray cannot rebuild it on the
            # driver; the driver validates first anyway, this is the backstop.
            raise ValueError(str(err)) from None
        if self.world_size != cfg.num_workers:
            raise ValueError(f"config field 'env.eval.num_workers': is {cfg.num_workers} but the env worker group "
                             f"has {self.world_size} ranks (fix: start one LiberoEnvWorker rank per env worker)")
        self.num_stages = pipeline_stage_num
        if episodes is None:
            episodes = eval_episodes(cfg)
        episodes = [Episode(*e) for e in episodes]
        plan = worker_plan(episodes, cfg.total_num_envs, cfg.num_workers, pipeline_stage_num, self.rank)
        self._stages = [EnvStage(s, [EnvSlot(g, eps, cfg, keep_process=keep_processes) for g, eps in plan[s]],
                                 cfg.image_size) for s in range(pipeline_stage_num)]
        self._observed = [False] * pipeline_stage_num  # entry s: under stage s's lock
        self._stage_locks = [threading.Lock() for _ in range(pipeline_stage_num)]
        self._state_lock = threading.Lock()  # guards _failure and _closed
        self._failure: str | None = None
        self._closed = False
        assigned = sum(len(eps) for stage in plan for _, eps in stage)
        self.logger.info("%s: %d of %d episodes on %d stage(s) x %d env(s), cap %s steps (%d settle), "
                         "%s commands of each chunk run",
                         cfg.suite_label, assigned, len(episodes), pipeline_stage_num,
                         cfg.envs_per_stage(pipeline_stage_num),
                         ", ".join(f"{s} {c}" for s, c in cfg.step_caps().items()) if cfg.multi_suite
                         else cfg.resolved_max_episode_steps(),
                         cfg.num_settle_steps, cfg.open_loop_steps or "all")

    # ------------------------------------------------------------------ guard
    def _check_usable(self, what: str) -> None:
        with self._state_lock:
            if self._failure is not None:
                raise RuntimeError(f"env worker rank {self.rank} failed earlier ({self._failure}); {what} refused")
            if self._closed:
                raise RuntimeError(f"env worker rank {self.rank} is closed; {what} refused")

    @contextmanager
    def _holding(self, stages: Sequence[int]) -> Iterator[None]:
        """Hold the locks of ``stages`` (ascending, so two multi-stage holders cannot deadlock)."""
        with ExitStack() as stack:
            for s in sorted(stages):
                stack.enter_context(self._stage_locks[s])
            yield

    @contextmanager
    def _guard(self, what: str, stages: Sequence[int]) -> Iterator[None]:
        """Run ``what`` holding ``stages``' locks; refuse it after a failure or close. On any exception
        record the failure before the locks go (so a call queued on the same stage is refused), then
        kill every simulator before the exception propagates."""
        self._check_usable(what)  # fail fast, without waiting for a busy stage
        failed = False
        try:
            bad = [s for s in stages if not 0 <= s < self.num_stages]
            if bad:
                failed = True
                err = ValueError(f"stage {bad[0]} out of range (pipeline_stage_num={self.num_stages})")
                self._record_failure(what, err)
                raise err
            with self._holding(stages):
                self._check_usable(what)  # close() or another stage's failure may have come meanwhile
                try:
                    yield
                except BaseException as exc:
                    failed = True
                    self._record_failure(what, exc)
                    raise
        finally:
            if failed:
                self._kill_all()

    def _record_failure(self, what: str, exc: BaseException) -> None:
        with self._state_lock:
            self._failure = self._failure or f"{what}: {type(exc).__name__}: {exc}"
        self.logger.error("%s failed, stopping all simulator processes: %s", what, exc)

    def _kill_all(self) -> None:
        """Kill every stage's simulators; a stage busy in another thread is killed when its call returns."""
        for s, stage in enumerate(self._stages):
            with self._stage_locks[s]:
                stage.kill()

    # ------------------------------------------------------------------ API
    def setup(self) -> dict[str, Any]:
        """Start the simulator process of every slot that has episodes (fails fast if the simulator
        environment is broken). Returns counts for the driver's log."""
        with self._guard("setup", range(self.num_stages)):
            for stage in self._stages:
                stage.start_processes()
            slots = [slot for stage in self._stages for slot in stage.slots]
            return {"rank": self.rank, "stages": self.num_stages, "slots": len(slots),
                    "busy_slots": sum(not s.idle for s in slots),
                    "episodes": sum(s.num_assigned for s in slots)}

    def observe(self, stage: int) -> StageOutput:
        """The stage's current observations; the first call builds and resets its envs (in parallel)."""
        with self._guard(f"observe({stage})", [stage]):
            started = time.monotonic()
            env_stage = self._stages[stage]
            if not self._observed[stage]:
                env_stage.run()
                self._observed[stage] = True
            return env_stage.output(started)

    def chunk_step(self, stage: int, actions: np.ndarray, slot_ids: Any = None) -> StageOutput:
        """Run ``actions[i]`` (``[K, 7]`` LIBERO commands) in the stage's i-th active env, all envs in
        parallel; finished episodes auto-reset into their slot's next one. ``slot_ids`` (from the
        observation) is checked against the active slots when given. Calls for different stages
        run concurrently."""
        with self._guard(f"chunk_step({stage})", [stage]):
            started = time.monotonic()
            env_stage = self._stages[stage]
            if not self._observed[stage]:
                raise RuntimeError(f"chunk_step({stage}) before observe({stage}): no observation was handed out")
            if self.cfg.open_loop_steps is not None:  # receding horizon: the rest of the chunk is dropped
                actions = np.asarray(actions)[:, :self.cfg.open_loop_steps]
            env_stage.step(actions, slot_ids)
            return env_stage.output(started)

    def assign(self, episodes: Sequence[Episode]) -> int:
        """Deal a new set of episodes over this worker's slots, as the constructor deals its own (every worker of
        the group gets the same list and takes its share); every stage must be done. The next ``observe(s)``
        starts them (RL's next round: with ``keep_processes`` the simulators are reused). Returns how many
        episodes this worker took."""
        with self._holding(range(self.num_stages)):  # a misuse, refused before the guard: the worker stays usable
            busy = not all(stage.done for stage in self._stages)
        if busy:
            raise RuntimeError("assign() while episodes of the previous set are still running or unreported")
        with self._guard("assign", range(self.num_stages)):
            cfg = self.cfg
            plan = worker_plan([Episode(*e) for e in episodes], cfg.total_num_envs, cfg.num_workers,
                               self.num_stages, self.rank)
            for s, stage in enumerate(self._stages):
                for slot, (slot_id, queue) in zip(stage.slots, plan[s], strict=True):
                    if slot.slot_id != slot_id:
                        raise RuntimeError(f"slot {slot.slot_id} of stage {s} got the episodes of slot {slot_id}")
                    slot.assign(queue)
                self._observed[s] = False
            return sum(len(queue) for stage in plan for _, queue in stage)

    # Control calls below take no stage lock (the spare actor thread answers them while stages
    # step): they read a snapshot that may be one reply old.
    def done(self) -> bool:
        """True when every episode of this worker has been reported."""
        return all(stage.done for stage in self._stages)

    def stats(self) -> list[dict[str, Any]]:
        """Per-slot counters (assigned/reported episodes, task builds, process starts, pid)."""
        return [{"stage": stage.stage, **describe(slot)} for stage in self._stages for slot in stage.slots]

    def sim_process_ids(self) -> list[int]:
        """OS pids of the live simulator processes (each also its process group id)."""
        pids = [slot.process_id for stage in self._stages for slot in stage.slots]
        return [pid for pid in pids if pid is not None]

    def close(self) -> None:
        """Stop every simulator process (idempotent; also after a failure). Waits for calls in
        flight on other threads to return first; calls arriving later are refused."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        for s, stage in enumerate(self._stages):
            with self._stage_locks[s]:
                stage.close()
        self.logger.info("env worker closed")


def start_env_workers(cluster: Cluster, cfg: EnvEvalConfig, pipeline_stage_num: int, *,
                      cpus_per_rank: float | None = None, name: str = "env",
                      episodes: Sequence[Episode] | None = None,
                      keep_processes: bool = False) -> WorkerGroup[LiberoEnvWorker]:
    """The ``cfg.num_workers`` env worker actors, each threaded so its stages step concurrently;
    ``episodes``: a subset of the config's to run (None: all of them); ``keep_processes``: see
    :class:`LiberoEnvWorker`.

    ``S + 1`` threads: one per stage plus one for control calls. ``cpus_per_rank`` defaults to half
    the cluster's CPUs over the workers (Ray bookkeeping only: the simulators are child processes
    Ray does not count; the other half is left to the rollout backend's actors).
    """
    if cpus_per_rank is None:
        cpus_per_rank = max(1.0, cluster.resources().total_cpus / (2 * cfg.num_workers))
    return WorkerGroup(LiberoEnvWorker, cluster, cfg.num_workers,
                       kwargs={"cfg": cfg, "pipeline_stage_num": pipeline_stage_num,
                               "episodes": None if episodes is None else list(episodes),
                               "keep_processes": keep_processes},
                       cpus_per_rank=cpus_per_rank, name=name, init_distributed=False,
                       max_concurrency=pipeline_stage_num + 1)
