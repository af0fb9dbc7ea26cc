"""The LIBERO env worker: a Ray actor holding ``S`` independent stages of ``E/(W*S)`` env slots.

Rank ``w`` of a ``WorkerGroup`` of ``W`` workers evaluates the episodes
:func:`~rlinf_cosmos3.workers.env.episodes.worker_plan` gives it. The pipelined eval runner drives
each stage on its own: ``observe(s)``, then ``chunk_step(s, actions)`` with the policy's
``[N, K, 7]`` chunk for the stage's ``N`` active envs, until the returned ``done``; meanwhile
another stage's request is being served. Every call returns a :class:`StageOutput` whose
``results`` are the episodes that ended since the stage last reported.

No simulator process outlives the worker: ``close()`` stops them; any exception escaping a method
kills them before it propagates (the worker is unusable afterwards); if the actor process itself
dies, the kernel closes its ends of the simulators' pipes and each simulator exits on the EOF.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from rlinf_cosmos3.cluster import Worker
from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.workers.env.config import EnvEvalConfig
from rlinf_cosmos3.workers.env.episodes import list_episodes, worker_plan
from rlinf_cosmos3.workers.env.slot import EnvSlot, describe
from rlinf_cosmos3.workers.env.stage import EnvStage, StageOutput


class LiberoEnvWorker(Worker):
    """See the module docstring. Construct through ``WorkerGroup(LiberoEnvWorker, cluster, W, ...)``."""

    def __init__(self, cfg: EnvEvalConfig, pipeline_stage_num: int = 1) -> None:
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
        episodes = list_episodes(cfg.resolved_task_ids(), cfg.trials_per_task)
        plan = worker_plan(episodes, cfg.total_num_envs, cfg.num_workers, pipeline_stage_num, self.rank)
        self._stages = [EnvStage(s, [EnvSlot(g, eps, cfg) for g, eps in plan[s]], cfg.image_size)
                        for s in range(pipeline_stage_num)]
        self._observed = [False] * pipeline_stage_num
        self._failure: str | None = None
        self._closed = False
        assigned = sum(len(eps) for stage in plan for _, eps in stage)
        self.logger.info("%s: %d of %d episodes on %d stage(s) x %d env(s), cap %d steps (%d settle)",
                         cfg.suite, assigned, len(episodes), pipeline_stage_num,
                         cfg.envs_per_stage(pipeline_stage_num), cfg.resolved_max_episode_steps(),
                         cfg.num_settle_steps)

    # ------------------------------------------------------------------ guard
    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Refuse work after a failure or close; on any exception, kill every simulator first."""
        if self._failure is not None:
            raise RuntimeError(f"env worker rank {self.rank} failed earlier ({self._failure}); {what} refused")
        if self._closed:
            raise RuntimeError(f"env worker rank {self.rank} is closed; {what} refused")
        try:
            yield
        except BaseException as exc:
            self._failure = f"{what}: {type(exc).__name__}: {exc}"
            self.logger.error("%s failed, stopping all simulator processes: %s", what, exc)
            for stage in self._stages:
                stage.kill()
            raise

    def _stage(self, stage: int) -> EnvStage:
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage {stage} out of range (pipeline_stage_num={self.num_stages})")
        return self._stages[stage]

    # ------------------------------------------------------------------ API
    def setup(self) -> dict[str, Any]:
        """Start the simulator process of every slot that has episodes (fails fast if the simulator
        environment is broken). Returns counts for the driver's log."""
        with self._guard("setup"):
            for stage in self._stages:
                stage.start_processes()
            slots = [slot for stage in self._stages for slot in stage.slots]
            return {"rank": self.rank, "stages": self.num_stages, "slots": len(slots),
                    "busy_slots": sum(not s.idle for s in slots),
                    "episodes": sum(s.num_assigned for s in slots)}

    def observe(self, stage: int) -> StageOutput:
        """The stage's current observations; the first call builds and resets its envs (in parallel)."""
        with self._guard(f"observe({stage})"):
            env_stage = self._stage(stage)
            if not self._observed[stage]:
                env_stage.run()
                self._observed[stage] = True
            return env_stage.output()

    def chunk_step(self, stage: int, actions: np.ndarray, slot_ids: Any = None) -> StageOutput:
        """Run ``actions[i]`` (``[K, 7]`` LIBERO commands) in the stage's i-th active env, all envs in
        parallel; finished episodes auto-reset into their slot's next one. ``slot_ids`` (from the
        observation) is checked against the active slots when given."""
        with self._guard(f"chunk_step({stage})"):
            env_stage = self._stage(stage)
            if not self._observed[stage]:
                raise RuntimeError(f"chunk_step({stage}) before observe({stage}): no observation was handed out")
            env_stage.step(actions, slot_ids)
            return env_stage.output()

    def done(self) -> bool:
        """True when every episode of this worker has been reported."""
        return all(stage.done for stage in self._stages)

    def stats(self) -> list[dict[str, Any]]:
        """Per-slot counters (assigned/reported episodes, task builds, process starts, pid)."""
        return [{"stage": stage.stage, **describe(slot)} for stage in self._stages for slot in stage.slots]

    def sim_process_ids(self) -> list[int]:
        """OS pids of the live simulator processes (each also its process group id)."""
        return [slot.process_id for stage in self._stages for slot in stage.slots if slot.process_id is not None]

    def close(self) -> None:
        """Stop every simulator process (idempotent; also after a failure)."""
        if self._closed:
            return
        self._closed = True
        for stage in self._stages:
            stage.close()
        self.logger.info("env worker closed")
