"""Pipelined LIBERO evaluation: CPU simulation of one env group overlaps GPU inference of the others.

``W`` env workers (Ray actors) each hold ``S`` env groups ("stages"). Every (worker, stage) pair runs
its own loop -- observe -> adapter groups envs by prompt length -> backend serves the requests ->
actions back in env order -> chunk step -- as an asyncio task. Ray actor calls and HTTP requests
are awaited, never blocked on, so while stage ``s`` is being simulated the requests of the other
stages are in flight on the servers (several at once, across servers), and the env workers are
threaded actors, so the chunk steps of different stages of one worker run at the same time too.
Unlike the reference (one request in flight per rollout rank), nothing here waits for a whole batch
of stages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlinf_cosmos3.cluster import Cluster, PlacementError, WorkerGroup
from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.runners.eval_resume import ResumeState
from rlinf_cosmos3.runners.eval_summary import (
    EvalSummary,
    caps_text,
    condition_lines,
    summarize,
    video_entry,
    write_summary,
)
from rlinf_cosmos3.tracking import ScalarWriter
from rlinf_cosmos3.workers.env.libero_env_worker import start_env_workers
from rlinf_cosmos3.workers.env.results import EpisodeResult, episode_log_line
from rlinf_cosmos3.workers.observation_keys import SLOT_IDS
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.backend import RolloutBackend
from rlinf_cosmos3.workers.rollout.factory import make_backend
from rlinf_cosmos3.workers.rollout.server_process import ServerStartError

logger = logging.getLogger("rlinf_cosmos3.eval")



class PipelinedEvalRunner:
    """Drives the env workers and a rollout backend through one evaluation.

    It starts (and stops) its env workers; the backend is its own unless one is handed to
    :meth:`run` (see there). With ``resume`` it runs only ``resume.remaining`` and appends them to the
    run directory's results.jsonl after the kept rows (see :mod:`rlinf_cosmos3.runners.eval_resume`).
    """

    def __init__(self, cfg: EvalConfig, run_dir: Path, resume: ResumeState | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.results: list[EpisodeResult] = []
        self.chunk_requests = 0
        self._waits = [0.0, 0.0]  # inference, sim (summed over stage loops)
        self._first_obs_end: float | None = None  # perf_counter when the first stage got its observation
        self._first_settle_steps = 0
        self._bar: tqdm | None = None
        self._writer: ScalarWriter | None = None
        self._results_file = None

    def run(self, cluster: Cluster, backend: RolloutBackend | None = None) -> EvalSummary:
        """Evaluate every assigned episode once; write results.jsonl, summary.json and TensorBoard.

        Without ``backend`` the runner makes the configured one, starts it once the env workers
        are up and closes it at the end (also on errors). With ``backend`` -- already started, e.g.
        one server shared by several runs, which saves its start-up (minutes) each time -- it is
        used as is and left running: whoever started it closes it. ``wall_time_s`` covers the
        first observation to the last chunk step (no simulator or backend start-up);
        ``steady_time_s`` starts at the end of the earliest stage's first observation instead.
        """
        cfg, env = self.cfg, self.cfg.env.eval
        resume = self.resume
        self.results = list(resume.kept) if resume else []
        self.chunk_requests, self._waits = 0, [0.0, 0.0]
        self._first_obs_end, self._first_settle_steps = None, 0
        owned = backend is None
        if backend is None:
            backend = make_backend(cfg.rollout.rollout_backend, cfg.rollout.model, sglang_cfg=cfg.rollout.sglang,
                                   embedded_cfg=cfg.rollout.embedded, replay_cfg=cfg.rollout.replay,
                                   log_dir=self.run_dir / "servers",
                                   cluster=cluster)
        adapter = Cosmos3ActionAdapter(cfg.rollout.model, cfg.rollout.batching_max_size)
        wall = steady = 0.0
        with start_env_workers(cluster, env, cfg.rollout.pipeline_stage_num,
                               episodes=resume.remaining if resume else None) as envs:
            infos = envs.call("setup")
            logger.info("env workers ready: %s", ", ".join(
                f"rank {i['rank']}: {i['episodes']} episodes on {i['busy_slots']}/{i['slots']} envs" for i in infos))
            with (backend if owned else nullcontext(backend)):
                logger.info("rollout backend %s ready%s", cfg.rollout.rollout_backend,
                            "" if owned else " (given by the caller, left running)")
                self._open_outputs(len(resume.remaining) if resume else env.num_episodes, append=resume is not None)
                try:
                    t0 = time.perf_counter()
                    asyncio.run(self._drive(envs, adapter, backend))
                    end = time.perf_counter()
                    wall = end - t0
                    steady = end - self._first_obs_end if self._first_obs_end is not None else 0.0
                finally:
                    self._close_outputs()
                    envs.call("close")
        summary = summarize(self.results, cfg, wall, self.chunk_requests, steady, self._first_settle_steps,
                            (self._waits[0], self._waits[1]), self.run_dir)
        if resume:
            summary.extra["resumed_episodes"] = len(resume.kept)
        write_summary(summary, self.results, self.run_dir)
        return summary

    async def _drive(self, envs: WorkerGroup, adapter: Cosmos3ActionAdapter, backend: RolloutBackend) -> None:
        stages = self.cfg.rollout.pipeline_stage_num
        loops = [self._stage_loop(actor, rank, s, adapter, backend)
                 for rank, actor in enumerate(envs.actors) for s in range(stages)]
        await asyncio.gather(*loops)

    async def _stage_loop(self, actor: Any, rank: int, stage: int, adapter: Cosmos3ActionAdapter,
                          backend: RolloutBackend) -> None:
        out = await actor.observe.remote(stage)
        if self._first_obs_end is None:
            self._first_obs_end = time.perf_counter()
        self._first_settle_steps += out.num_envs * self.cfg.env.eval.num_settle_steps
        while True:
            self._record(out.results)
            if out.done or out.num_envs == 0:
                if not out.done:
                    raise RuntimeError(f"env worker {rank} stage {stage} has no active env but is not done")
                return
            t0 = time.perf_counter()
            actions = await adapter.predict(out.obs, backend)
            t1 = time.perf_counter()
            self.chunk_requests += 1
            out = await actor.chunk_step.remote(stage, actions, out.obs[SLOT_IDS])
            self._waits[0] += t1 - t0
            self._waits[1] += time.perf_counter() - t1

    # ------------------------------------------------------------------ outputs

    def _open_outputs(self, num_episodes: int, append: bool = False) -> None:
        self._results_file = (self.run_dir / "results.jsonl").open("a" if append else "w")
        self._writer = ScalarWriter(self.run_dir / "tensorboard", prefix="eval")
        self._bar = tqdm(total=num_episodes, desc="eval episodes", unit="ep", dynamic_ncols=True)

    def _close_outputs(self) -> None:
        for closable in (self._bar, self._writer, self._results_file):
            if closable is not None:
                closable.close()

    def _record(self, results: list[EpisodeResult]) -> None:
        for result in results:
            self.results.append(result)
            line = episode_log_line(result)
            logger.info(f"{line}, suite={result.suite}" if self.cfg.env.eval.multi_suite else line)
            row = {**result.to_dict(), "video": video_entry(result, self.run_dir)}
            self._results_file.write(json.dumps(row) + "\n")
            self._results_file.flush()  # on disk as each episode ends: a killed eval loses only those in flight
            os.fsync(self._results_file.fileno())
            n = len(self.results)
            once = sum(r.success_once for r in self.results) / n
            self._writer.log({"success_once": once,
                              "success_at_end": sum(r.success_at_end for r in self.results) / n,
                              "episode_steps": result.steps}, step=n)
            self._bar.update(1)
            self._bar.set_postfix(success=f"{once:.2f}")


EVAL_LOG_NAME = "eval_embodiment.log"


def run_name(resolved: dict[str, Any], config_name: str) -> str:
    """The run directory's name after its timestamp: ``runner.experiment_name`` when set (and a plain name;
    otherwise the config check reports it from inside the run directory), else the config's name."""
    from rlinf_cosmos3.config.eval import is_plain_name

    name = (resolved.get("runner") or {}).get("experiment_name")
    return name if isinstance(name, str) and is_plain_name(name) else config_name


def run_eval(raw_cfg: Any, config_name: str) -> int:
    """Run an evaluation from a Hydra config; returns a process exit code (0 ok, 2 bad config, 1 when the
    rollout backend's servers do not start)."""
    from rlinf_cosmos3.config import ConfigError
    from rlinf_cosmos3.runners.eval_resume import prepare_resume, resumable_dir, start_resumed_run
    from rlinf_cosmos3.tracking import start_run
    from rlinf_cosmos3.tracking.run_dir import resolve_config
    from rlinf_cosmos3.validation.eval import load_eval_config

    resolved = resolve_config(raw_cfg)
    if (resumed := resumable_dir(resolved)) is not None:  # else the config check says why
        run_dir = start_resumed_run(resumed, EVAL_LOG_NAME)
    else:
        resolved, run_dir = start_run(resolved, run_name(resolved, config_name), EVAL_LOG_NAME)
    try:
        cfg = load_eval_config(resolved)
        # Ray actors may run elsewhere: hand them absolute paths; videos go inside the run directory.
        model, replay = cfg.rollout.model, cfg.rollout.replay
        model.action_stats_path = str(Path(model.action_stats_path).resolve())
        if model.model_path not in ("", "???"):  # the replay backend runs without a model
            model.model_path = str(Path(model.model_path).resolve())
        if cfg.rollout.rollout_backend == "replay":
            replay.dataset_root = str(Path(replay.dataset_root).resolve())
            if replay.stats_path is not None:
                replay.stats_path = str(Path(replay.stats_path).resolve())
        if cfg.env.eval.records_video and not Path(cfg.env.eval.video_dir).is_absolute():
            cfg.env.eval.video_dir = str((run_dir.root / cfg.env.eval.video_dir).resolve())
        resume = prepare_resume(cfg) if cfg.runner.resume_dir is not None else None
    except ConfigError as err:
        logger.error("invalid config: %s", err)
        return 2
    env = cfg.env.eval
    tasks = sum(len(env.resolved_task_ids(s)) for s in env.resolved_suites())
    logger.info("evaluating %s: %d tasks x %d init states = %d episodes, cap %s steps (incl. %d settle), "
                "%d envs = %d worker(s) x %d stage(s) x %d, backend %s",
                env.suite_label, tasks, len(env.resolved_init_state_ids()), env.num_episodes,
                ", ".join(f"{s} {c}" for s, c in env.step_caps().items()) if env.multi_suite
                else env.resolved_max_episode_steps(), env.num_settle_steps, env.total_num_envs, env.num_workers,
                cfg.rollout.pipeline_stage_num, env.envs_per_stage(cfg.rollout.pipeline_stage_num),
                cfg.rollout.rollout_backend)
    for line in condition_lines(env.init_states_from_task, env.instruction_override):
        logger.info("%s", line)
    if resume is not None:
        logger.info("resuming %s: %d episodes kept, %d to run (%d of them had ended with an error)", run_dir.root,
                    len(resume.kept), len(resume.remaining), resume.rerun_errors)
    if resume is not None and not resume.remaining:  # nothing to simulate: no Ray, no server
        summary = summarize(resume.kept, cfg, 0.0, 0, run_dir=run_dir.root)
        summary.extra["resumed_episodes"] = len(resume.kept)
        write_summary(summary, resume.kept, run_dir.root)
    else:
        try:
            with Cluster(cfg.cluster) as cluster:  # Ray, env workers and servers are all stopped on the way out
                summary = PipelinedEvalRunner(cfg, run_dir.root, resume).run(cluster)
        except ServerStartError as err:  # e.g. a bad rollout.sglang.extra_server_args: the log tail says why
            logger.error("the rollout backend did not start (simulators, servers and Ray are stopped): %s", err)
            return 1
        except PlacementError as err:  # known once Ray reports the cluster; Ray is stopped by then
            logger.error("the env workers or servers do not fit this cluster: %s", err)
            return 2
    logger.info("summary: success_once=%.4f success_at_end=%.4f num_trajectories=%d errors=%d "
                "(%s, cap %s steps%s) wall %.1f s, %.2f env-steps/s; stages waited %.1f s on inference, "
                "%.1f s on simulation",
                summary.success_once, summary.success_at_end, summary.num_trajectories, summary.num_errors,
                summary.suite, caps_text(summary.step_cap),
                "".join(f"; {line}" for line in condition_lines(summary.init_states_from_task,
                                                                 summary.instruction_override)),
                summary.wall_time_s, summary.env_steps_per_s, summary.inference_wait_s, summary.sim_wait_s)
    logger.info("results: %s | summary: %s | picture: %s | TensorBoard: tensorboard --logdir %s%s",
                run_dir.root / "results.jsonl", run_dir.root / "summary.json", run_dir.root / "success.png",
                run_dir.tensorboard,
                f" | videos ({env.save_video}): {env.video_dir}" if env.records_video else "")
    return 0
