"""One RL rollout round: the env workers' stages served by the actor's sampler until every episode has ended.

The eval's pipelined loop (:mod:`rlinf_cosmos3.runners.eval_runner`), with the actor rank in the backend's place:
one asyncio task per (env worker, stage) observes its envs, sends their observations to the actor's
``sample`` (one batch per stage and step, the packed forward over the batch), and steps its envs with the
commands. While one stage is simulated, the others' observations are sampled (the actor runs one call at a time).

What a decision needs besides its chain (which stays on the actor) is recorded here, per env: which attempt of the
episode it belongs to. An env whose simulator crashed restarts its episode from the start (the env slot's retry);
the decisions of the failed attempt are dropped when the episode's result names the attempt that finished, so a
crashed run is never trained on or counted. An episode that fails on every attempt is left out of the round.
Every decision's noise is seeded by ``(run seed, iteration, env, attempt, decision)``: a re-run round repeats,
whatever the batching.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from rlinf_cosmos3.cluster import WorkerGroup
from rlinf_cosmos3.rl.rollout_sampler import decision_seed
from rlinf_cosmos3.workers.env.results import EpisodeResult
from rlinf_cosmos3.workers.env.slot import FinalObservation
from rlinf_cosmos3.workers.observation_keys import (
    ATTEMPTS,
    MAIN_IMAGES,
    SLOT_IDS,
    TASK_DESCRIPTIONS,
    WRIST_IMAGES,
)

logger = logging.getLogger("rlinf_cosmos3.rl")


@dataclass
class CollectedEpisode:
    """An episode that ended without error, and the decisions of its finishing attempt, in order."""

    result: EpisodeResult
    decision_ids: list[int]
    values: list[float] = field(default_factory=list)
    """PPO: the value head's ``V`` of each decision's observation, as the actor returned it (GAE's input); empty
    for GRPO."""
    final_value: float | None = None
    """PPO: ``V`` of the observation a truncated episode (the cap, no success) stopped at, its return's bootstrap;
    None for GRPO and for an episode that ended in success."""


@dataclass
class RoundResult:
    """What one round produced, and where its time went."""

    episodes: list[CollectedEpisode] = field(default_factory=list)
    failed: list[EpisodeResult] = field(default_factory=list)
    """Episodes whose every attempt crashed: left out of the round."""
    dropped_decisions: int = 0
    """Decisions of crashed attempts (never trained on)."""
    decisions: int = 0
    sample_calls: int = 0
    sample_s: float = 0.0
    """Time the actor spent sampling (its own measure), the truncated episodes' final values included."""
    final_values: int = 0
    """PPO: truncated episodes whose last observation the actor valued (one ``observation_values`` call each
    stage step that ended any)."""
    wall_s: float = 0.0

    @property
    def kept_decisions(self) -> int:
        """Decisions of the kept attempts: what the round counts and may train on."""
        return self.decisions - self.dropped_decisions


class RoundCollector:
    """Plays one round: the episodes handed to the env workers beforehand (``assign``), served by ``actor``."""

    def __init__(self, envs: WorkerGroup, actor: Any, *, stages: int, seed: int, iteration: int, num_episodes: int,
                 progress: bool = True) -> None:
        self.envs = envs
        self.stages = stages
        self.actor = actor
        self.seed = seed
        self.iteration = iteration
        self.result = RoundResult()
        self._pending: dict[int, list[tuple[int, int]]] = defaultdict(list)
        """env slot -> (attempt, decision id) of its current episode's decisions so far."""
        self._values: dict[int, float] = {}
        """PPO: decision id -> its value, as the actor's ``sample`` returned it."""
        self._final_values: dict[tuple[int, int], float] = {}
        """PPO: (env slot, attempt) -> the value of the observation its truncated episode stopped at."""
        self._bar = tqdm(total=num_episodes, desc=f"iteration {iteration}: rollout", unit="ep", dynamic_ncols=True,
                         disable=not progress, leave=False)

    def run(self) -> RoundResult:
        started = time.perf_counter()
        try:
            asyncio.run(self._drive())
        finally:
            self._bar.close()
        self.result.wall_s = time.perf_counter() - started
        return self.result

    async def _drive(self) -> None:
        loops = [self._stage_loop(actor, stage) for actor in self.envs.actors for stage in range(self.stages)]
        await asyncio.gather(*loops)

    async def _stage_loop(self, env: Any, stage: int) -> None:
        out = await env.observe.remote(stage)
        while True:
            if out.final_obs:
                await self._value_final_observations(out.final_obs)
            self._record(out.results)
            if out.done or out.num_envs == 0:
                if not out.done:
                    raise RuntimeError(f"env stage {stage} has no active env but is not done")
                return
            obs = out.obs
            slots = [int(s) for s in obs[SLOT_IDS]]
            attempts = [int(a) for a in obs[ATTEMPTS]]
            seeds = [decision_seed(self.seed, self.iteration, slot, attempt,
                                   sum(a == attempt for a, _ in self._pending[slot]))
                     for slot, attempt in zip(slots, attempts, strict=True)]
            reply = await self.actor.sample.remote(obs[MAIN_IMAGES], obs[WRIST_IMAGES], obs[TASK_DESCRIPTIONS], seeds)
            for slot, attempt, decision in zip(slots, attempts, reply["ids"], strict=True):
                self._pending[slot].append((attempt, decision))
            if "values" in reply:
                self._values.update(zip(reply["ids"], reply["values"], strict=True))
            self.result.decisions += len(slots)
            self.result.sample_calls += 1
            self.result.sample_s += reply["sample_s"]
            out = await env.chunk_step.remote(stage, reply["actions"], obs[SLOT_IDS])

    async def _value_final_observations(self, finals: list[FinalObservation]) -> None:
        """The actor's ``V`` of each truncated episode's last observation, seeded as the attempt's next decision
        would have been (a re-run round repeats it)."""
        seeds = [decision_seed(self.seed, self.iteration, f.slot_id, f.attempt,
                               sum(a == f.attempt for a, _ in self._pending[f.slot_id])) for f in finals]
        reply = await self.actor.observation_values.remote(
            np.stack([f.main_image for f in finals]), np.stack([f.wrist_image for f in finals]),
            [f.prompt for f in finals], seeds)
        for final, value in zip(finals, reply["values"], strict=True):
            self._final_values[(final.slot_id, final.attempt)] = float(value)
        self.result.final_values += len(finals)
        self.result.sample_s += reply["sample_s"]

    def _record(self, results: list[EpisodeResult]) -> None:
        for result in results:
            decisions = self._pending.pop(result.slot_id, [])
            kept = [decision for attempt, decision in decisions if attempt == result.attempts]
            self.result.dropped_decisions += len(decisions) - len(kept)
            if result.error is not None:
                self.result.dropped_decisions += len(kept)
                self.result.failed.append(result)
                logger.warning("iteration %d: task %d init state %d left out of the round: %s", self.iteration,
                               result.task_id, result.trial_id, result.error)
            else:
                if result.attempts > 1:
                    logger.warning("iteration %d: task %d init state %d ran %d times (simulator crash); only the "
                                   "last run's %d decisions count", self.iteration, result.task_id, result.trial_id,
                                   result.attempts, len(kept))
                values = [self._values.pop(d) for d in kept] if self._values else []
                final = self._final_values.pop((result.slot_id, result.attempts), None)
                self.result.episodes.append(CollectedEpisode(result, kept, values, final))
            self._bar.update(1)
            done = self.result.episodes
            if done:
                self._bar.set_postfix(success=f"{sum(e.result.success_once for e in done) / len(done):.2f}")
