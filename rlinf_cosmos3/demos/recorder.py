"""Records scripted LIBERO demonstrations with the real simulator into a LeRobot v3 dataset.

One episode = reset to one of LIBERO's fixed init states, ``num_settle_steps`` no-op steps that are
*not* recorded (LIBERO's evaluation also lets objects settle first, so frame 0 matches what a policy
sees at evaluation), then the scripted policy until it has released the object and retreated, or
``max_steps`` recorded steps. Frame t holds the observation before command t and command t.
Success comes only from the simulator's ``check_success``: ``success`` at the last recorded step and
``success_once`` over all recorded steps. Failed episodes are dropped unless ``keep_failed``.

Several simulator processes (``num_envs``) step side by side, each served as soon as it replies;
finished episodes are handed to writer processes (:class:`~rlinf_cosmos3.demos.episode_store.EpisodeStore`), so stepping never
waits for a video encode. Each process goes through an episode as evaluation's env slots do
(:class:`~rlinf_cosmos3.sim.episode.EpisodeProgress`), one scripted command per step.

The output appears only complete: episodes collect in ``<out>.partial`` and are joined into ``out`` at the
end. An interrupted recording (Ctrl-C, a kill, a crash) is continued by running it again with the same
settings: the episodes already recorded are kept and only the rest are recorded.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlinf_cosmos3.demos.checks import check_record_config
from rlinf_cosmos3.demos.episode_store import EpisodeStore, job_key, partial_dir
from rlinf_cosmos3.demos.lerobot_writer import EpisodeRecord
from rlinf_cosmos3.demos.record_config import RecordConfig
from rlinf_cosmos3.demos.scripted_policy import ScriptedPickPlace, UnsupportedTaskError
from rlinf_cosmos3.sim.client import LiberoSimProcess, Reply, wait_for_replies
from rlinf_cosmos3.sim.episode import EpisodeProgress, Phase

logger = logging.getLogger(__name__)

CAMERA_STORAGES = ("video", "image")


@dataclass
class RecordedEpisodeResult:
    """One attempted episode, kept in the dataset or not."""

    task_id: int
    init_state_id: int
    task: str
    success: bool
    success_once: bool
    num_steps: int
    seconds: float
    regrasps: int
    episode_index: int | None  # index in the dataset, None if dropped
    skipped: str | None = None  # why the task was not attempted (a goal the policy cannot do)
    repeat: int = 0  # which recording of this task and init state
    kept: bool = False  # written to the dataset (its index is known once the dataset is complete)


@dataclass
class _Episode:
    task_id: int
    init_state_id: int
    repeat: int = 0
    task: str = ""
    policy: ScriptedPickPlace | None = None
    obs: Reply | None = None
    frames: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    success: bool = False
    success_once: bool = False
    skipped: str | None = None
    started: float = field(default_factory=time.monotonic)


class _RecorderSlot:
    """One simulator process, where it is in its episode, and the episode's recording."""

    def __init__(self, proc: LiberoSimProcess, num_settle_steps: int) -> None:
        self.proc = proc
        self.sim = EpisodeProgress(num_settle_steps, privileged=True)  # scripted policies read the scene
        self.task = ""  # LIBERO's instruction of the task the process holds
        self.episode: _Episode | None = None


def expand_jobs(
    task_ids: Sequence[int], init_state_ids: Sequence[int], repeats: int = 1
) -> list[tuple[int, int, int]]:
    """All (task, init state, repeat) triples, task-major so each process rebuilds its env rarely."""
    return [(t, i, r) for t in task_ids for i in init_state_ids for r in range(repeats)]


def episode_seed(seed: int, task_id: int, init_state_id: int, repeat: int) -> int:
    """The scripted policy's seed for one episode (repeat 0: the seed recordings always had)."""
    return seed * 100003 + task_id * 1009 + init_state_id + repeat * 10_000_019


class DemoRecorder:
    """Runs the episodes of a :class:`RecordConfig` and hands the kept ones to the store."""

    def __init__(self, cfg: RecordConfig, store: EpisodeStore) -> None:
        self.cfg = cfg
        self.store = store
        self.seconds: dict[str, float] = defaultdict(float)  # where the recording loop's time went
        self.max_steps = cfg.resolved_max_steps()
        self.results: list[RecordedEpisodeResult] = []
        self.unsupported: dict[int, str] = {}  # task id -> why the scripted policy cannot do it
        self.task_text: dict[int, str] = {}  # task id -> LIBERO's language instruction

    # ------------------------------------------------------------------ per-slot requests
    def _next_request(self, slot: _RecorderSlot) -> None:
        """Send the request that moves ``slot``'s episode forward."""
        ep, sim = slot.episode, slot.sim
        assert ep is not None
        cfg = self.cfg
        if sim.phase is Phase.START:
            sim.send_start(slot.proc, camera_height=cfg.image_size, camera_width=cfg.image_size, seed=cfg.seed)
        elif sim.phase is Phase.SETTLE:
            sim.send_chunk(slot.proc)
        else:  # READY: the scripted command for this observation, recorded with it, is the next step
            assert ep.policy is not None and ep.obs is not None
            t0 = time.perf_counter()
            command = ep.policy.act(ep.obs)
            self.seconds["policy"] += time.perf_counter() - t0
            label = ep.policy.last_clean_action if cfg.recorded_action == "clean" else command
            ep.frames.append((ep.obs["main_image"], ep.obs["wrist_image"], ep.obs["state"], label))
            sim.give(np.asarray(command)[None])
            sim.send_chunk(slot.proc)

    def _on_reply(self, slot: _RecorderSlot, reply: Reply) -> bool:
        """Advance ``slot``'s episode with ``reply``; True when the episode has ended."""
        ep, sim = slot.episode, slot.sim
        assert ep is not None
        cmd = sim.on_reply(reply)
        if cmd == "make":
            slot.task = str(reply["task"])
            self.task_text[ep.task_id] = ep.task = slot.task
            return False
        ep.obs = reply
        if sim.phase is Phase.SETTLE:
            return False
        if cmd in ("reset", "settle"):  # settled: the scripted policy starts from this observation
            try:
                seed = episode_seed(self.cfg.seed, ep.task_id, ep.init_state_id, ep.repeat)
                ep.policy = ScriptedPickPlace(reply["goal"], self.cfg.policy, seed=seed)
            except UnsupportedTaskError as exc:
                ep.skipped = self.unsupported[ep.task_id] = str(exc)
                return True
            return False
        ep.success = bool(reply["success"])
        ep.success_once |= ep.success
        assert ep.policy is not None
        return ep.policy.done or len(ep.frames) >= self.max_steps or bool(reply["done"])

    def _start(self, slot: _RecorderSlot, job: tuple[int, int, int]) -> None:
        task_id, init_id, repeat = job
        slot.episode = _Episode(task_id=task_id, init_state_id=init_id, repeat=repeat)
        # the scene from the job's own seed: an episode is the same whichever process records it, after
        # whichever episodes (the furniture is placed anew at every reset: LiberoSession.reset)
        slot.sim.begin(self.cfg.suite, task_id, init_id, reset_seed=episode_seed(self.cfg.seed, task_id, init_id, repeat))
        if slot.sim.built == (self.cfg.suite, task_id):  # no make: the process holds this task
            slot.episode.task = slot.task

    def _skip(self, ep: _Episode) -> RecordedEpisodeResult:
        logger.warning("%s task %d init %d: skipped, %s", self.cfg.suite, ep.task_id, ep.init_state_id, ep.skipped)
        result = RecordedEpisodeResult(task_id=ep.task_id, init_state_id=ep.init_state_id, task=ep.task,
                                       success=False, success_once=False, num_steps=0,
                                       seconds=time.monotonic() - ep.started, regrasps=0, episode_index=None,
                                       skipped=ep.skipped, repeat=ep.repeat)
        self.store.record_dropped(job_key(ep.task_id, ep.init_state_id, ep.repeat), vars(result))
        return result

    def _finish(self, ep: _Episode) -> RecordedEpisodeResult:
        """Hand a finished episode to the store (or record that it was dropped) and log one line about it."""
        if ep.skipped is not None:
            return self._skip(ep)
        keep = ep.success or self.cfg.keep_failed
        assert ep.policy is not None
        result = RecordedEpisodeResult(task_id=ep.task_id, init_state_id=ep.init_state_id, task=ep.task,
                                       success=ep.success, success_once=ep.success_once, num_steps=len(ep.frames),
                                       seconds=time.monotonic() - ep.started, regrasps=ep.policy.regrasps,
                                       episode_index=None, repeat=ep.repeat, kept=keep)
        key = job_key(ep.task_id, ep.init_state_id, ep.repeat)
        t0 = time.perf_counter()
        if keep:
            self.store.submit(key, ep.frames, ep.task, EpisodeRecord(
                success=ep.success, success_once=ep.success_once, suite=self.cfg.suite,
                task_id=ep.task_id, init_state_id=ep.init_state_id, num_settle_steps=self.cfg.num_settle_steps,
                repeat=ep.repeat), vars(result))
        else:
            self.store.record_dropped(key, vars(result))
        self.seconds["hand_over"] += time.perf_counter() - t0
        logger.info("%s task %d init %d%s: %s (once %s) in %d steps, %.1fs, regrasps %d, %s",
                    self.cfg.suite, ep.task_id, ep.init_state_id,
                    f" repeat {ep.repeat}" if self.cfg.repeats > 1 else "", "success" if ep.success else "FAILURE",
                    ep.success_once, result.num_steps, result.seconds, result.regrasps,
                    "kept" if keep else "dropped")
        return result

    # ------------------------------------------------------------------ main loop
    def _assign(self, slot: _RecorderSlot, jobs: list[tuple[int, int, int]], progress: Any) -> bool:
        """Give ``slot`` the next job it can attempt and send its first request; False when none is left."""
        while jobs:
            task_id, init_id, repeat = job = jobs.pop()
            if task_id in self.unsupported:
                self._record(self._skip(_Episode(task_id, init_id, repeat, task=self.task_text.get(task_id, ""),
                                                 skipped=self.unsupported[task_id])), progress)
                continue
            self._start(slot, job)
            self._next_request(slot)
            return True
        return False

    def run(self, procs: Sequence[LiberoSimProcess], jobs: Sequence[tuple[int, int, int]],
            progress: Any = None) -> list[RecordedEpisodeResult]:
        """Record ``jobs`` (task, init state, repeat) on ``procs``; ``progress``: a tqdm bar.

        Each simulator is served as soon as its own reply arrives, so none waits for another one's reset,
        task build or video hand-over (in lockstep every round lasted as long as its slowest simulator).
        Which process records which job then depends on timing; what each episode holds does not (its
        policy seed is the job's, and the dataset is joined in job order)."""
        pending = list(jobs)[::-1]
        waiting: dict[int, _RecorderSlot] = {}  # process id -> slot with a request in flight
        for proc in procs:
            slot = _RecorderSlot(proc, self.cfg.num_settle_steps)
            if self._assign(slot, pending, progress):
                waiting[proc.process_id] = slot
        while waiting:
            t0 = time.perf_counter()
            ready = wait_for_replies([s.proc for s in waiting.values()], timeout_s=1.0)
            self.seconds["simulator_wait"] += time.perf_counter() - t0
            for proc in ready:
                slot = waiting[proc.process_id]
                ended = self._on_reply(slot, proc.recv())
                if not ended:
                    self._next_request(slot)
                    continue
                assert slot.episode is not None
                self._record(self._finish(slot.episode), progress)
                slot.episode = None
                slot.sim.end()
                if not self._assign(slot, pending, progress):
                    del waiting[proc.process_id]
        return self.results

    def _record(self, result: RecordedEpisodeResult, progress: Any) -> None:
        self.results.append(result)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(success=f"{success_rate(self.results):.0%}")


def success_rate(results: Sequence[RecordedEpisodeResult]) -> float:
    """Share of the *attempted* episodes (skipped ones excluded) that ended in success."""
    attempted = [r for r in results if r.skipped is None]
    return float(np.mean([r.success for r in attempted])) if attempted else 0.0


def per_task_summary(results: Sequence[RecordedEpisodeResult]) -> dict[int, dict[str, Any]]:
    """task id -> attempted episodes, successes, success rates, mean steps/seconds, skip reason."""
    by_task: dict[int, list[RecordedEpisodeResult]] = defaultdict(list)
    for r in results:
        by_task[r.task_id].append(r)
    summary: dict[int, dict[str, Any]] = {}
    for t, rs in sorted(by_task.items()):
        done = [r for r in rs if r.skipped is None]
        summary[t] = {
            "task": rs[0].task,
            "episodes": len(done),
            "successes": sum(r.success for r in done),
            "success_rate": success_rate(done),
            "success_once_rate": float(np.mean([r.success_once for r in done])) if done else 0.0,
            "mean_steps": float(np.mean([r.num_steps for r in done])) if done else 0.0,
            "mean_seconds": float(np.mean([r.seconds for r in done])) if done else 0.0,
            "skipped": next((r.skipped for r in rs if r.skipped is not None), None),
        }
    return summary


def record_demos(cfg: RecordConfig, show_progress: bool = True,
                 timings: dict[str, float] | None = None) -> list[RecordedEpisodeResult]:
    """Start ``cfg.num_envs`` simulator processes, record what ``<out>.partial`` does not hold yet, join
    every kept episode into ``out``, shut down. Returns one result per job, in job order.

    On errors and Ctrl-C the simulators are stopped and the episodes finished so far are written into
    ``<out>.partial`` (``out`` is not created): the same command continues the recording.
    ``timings``, when given, receives where the time went (seconds: simulator_wait, policy, hand_over,
    writer_wait, finish_writes, publish, total).
    """
    from tqdm import tqdm

    # Every input, before the store creates a directory and before a simulator starts.
    check_record_config(cfg, CAMERA_STORAGES)
    t_start = time.monotonic()
    all_jobs = expand_jobs(cfg.task_ids, cfg.init_state_ids, cfg.repeats)
    store = EpisodeStore(cfg, writer_procs=cfg.writer_procs)
    done = store.open()
    jobs = [j for j in all_jobs if job_key(*j) not in done]
    if done:
        logger.info("continuing the recording in %s: %d of %d episodes were finished before, %d to record",
                    store.dir, len(all_jobs) - len(jobs), len(all_jobs), len(jobs))
    procs: list[LiberoSimProcess] = []
    recorder = DemoRecorder(cfg, store)
    for outcome in done.values():
        fields = {k: v for k, v in outcome.result.items() if k in RecordedEpisodeResult.__dataclass_fields__}
        recorder.results.append(RecordedEpisodeResult(**fields))
    finished = published = False
    index: dict[str, int] = {}
    results: list[RecordedEpisodeResult] = []
    try:
        store.start()
        for i in range(min(cfg.num_envs, len(jobs))):
            procs.append(LiberoSimProcess(name=f"libero-demo-{i}"))
        with tqdm(total=len(all_jobs), initial=len(done), desc=f"{cfg.suite} demos", unit="ep",
                  disable=not show_progress) as bar:
            recorder.run(procs, jobs, progress=bar)
        finished = True
        for proc in procs:
            proc.close()
        t0 = time.monotonic()
        store.drain()
        recorder.seconds["finish_writes"] = time.monotonic() - t0
        order = {job: n for n, job in enumerate(all_jobs)}
        results = sorted(recorder.results, key=lambda r: order[(r.task_id, r.init_state_id, r.repeat)])
        kept = [job_key(r.task_id, r.init_state_id, r.repeat) for r in results if r.kept]
        logger.info("joining %d kept episodes into %s", len(kept), cfg.out)
        t0 = time.monotonic()
        index = store.publish(kept, {job_key(r.task_id, r.init_state_id, r.repeat): vars(r) for r in results})
        recorder.seconds["publish"] = time.monotonic() - t0
        published = True
    finally:
        for proc in procs:
            proc.close()
        try:
            if not finished:
                store.drain()  # the finished episodes' writes: kept for the next run
        finally:
            store.close()
        if not published:
            logger.error("recording stopped: the finished episodes are in %s; run the same command again to "
                         "record the rest", partial_dir(cfg.out))
    for r in results:
        r.episode_index = index.get(job_key(r.task_id, r.init_state_id, r.repeat))
    recorder.seconds["writer_wait"] = store.write_wait_s
    recorder.seconds["total"] = time.monotonic() - t_start
    logger.info("recorded %s in %.1f s: %s", cfg.out, recorder.seconds["total"],
                ", ".join(f"{k} {v:.1f} s" for k, v in recorder.seconds.items() if k != "total"))
    if timings is not None:
        timings.update(recorder.seconds)
    return results
