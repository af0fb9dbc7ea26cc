"""The RL driver: validate, start the actor and the env workers, loop rollout -> GRPO -> update, log, checkpoint.

Per iteration (docs/rl.md, "The training loop"):

1. **rollout**: the round's starts (:func:`~rlinf_cosmos3.rl.rounds.round_starts`: ``rollout.num_envs /
   algorithm.group_size`` (task, init state) pairs from ``env.init_state_ids``), each played by ``group_size``
   envs at once; the actor's sampler serves the envs' observations in batches
   (:mod:`rlinf_cosmos3.runners.rl_rollout`); an episode ends at its first success (reward 1 at that decision) or
   at the suite's cap;
2. **advantages**: GRPO per group of the same start, groups whose episodes all succeeded or all failed dropped; or
   PPO's GAE over each episode's per-decision rewards and the values the actor returned with its decisions
   (:func:`~rlinf_cosmos3.rl.rounds.ppo_decisions`);
3. **update**: PPO-clip epochs over minibatches of the kept decisions on the actor (:class:`FSDPRLWorker`), with
   PPO's clipped value loss on the value head;
4. **log**: TensorBoard ``rl/*`` (success per task under ``rl_task_success/*``) and one log line;
5. **save** every ``runner.save_interval`` iterations and after the last: ``global_step_<iteration>`` with SFT's
   layout (it converts with ``toolkits/cosmos3/convert_checkpoint.py``), retention and the disk check as SFT;
   the online evaluation of SFT when ``runner.eval_interval`` is set.

Nothing outlives the driver: the env workers close their simulators, the Cluster stops Ray (also on Ctrl-C and
SIGTERM, which Ray turns into ``sys.exit``), and the Cluster's reaper stops what is left if the driver is killed.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from rlinf_cosmos3.checkpoint.errors import InsufficientSpaceError
from rlinf_cosmos3.cluster import Cluster, PlacementError, WorkerGroup
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.rl import RLConfig, sft_view
from rlinf_cosmos3.models.cosmos3.identity import ModelIdentity
from rlinf_cosmos3.rl.rounds import (
    RoundDecisions,
    grpo_decisions,
    ppo_decisions,
    round_reset_seeds,
    round_starts,
)
from rlinf_cosmos3.runners.checkpoint_save import save_checkpoint_step
from rlinf_cosmos3.runners.checkpoint_space import (
    CheckpointPlan,
    checkpoint_root,
    preflight,
)
from rlinf_cosmos3.runners.online_eval import OnlineEvaluator
from rlinf_cosmos3.runners.rl_rollout import RoundCollector, RoundResult
from rlinf_cosmos3.tracking import ScalarWriter, start_run
from rlinf_cosmos3.validation.rl import load_rl_config
from rlinf_cosmos3.validation.rollout import served_identity
from rlinf_cosmos3.workers.env.episodes import Episode
from rlinf_cosmos3.workers.env.libero_env_worker import start_env_workers

logger = logging.getLogger("rlinf_cosmos3.rl")

RUN_LOG_NAME = "rl_embodiment.log"
COUNTERS = ("episodes", "env_steps", "decisions")
"""The run's totals, saved in every checkpoint (a resumed run goes on counting)."""

__all__ = ["RLRunner", "absolute_paths", "run_rl"]


def run_rl(raw_cfg: DictConfig | dict[str, Any], config_name: str) -> int:
    """Run RL from a Hydra config; returns a process exit code (0 ok, 2 bad config or too little disk)."""
    resolved, run_dir = start_run(raw_cfg, config_name, RUN_LOG_NAME)
    try:
        # As written first (a missing '???' must not become a path), then as the actor gets it: absolute paths.
        load_rl_config(resolved)
        resolved = absolute_paths(resolved)
        cfg = load_rl_config(resolved)
        identity = served_identity(cfg.rollout.model)
        plan = preflight(sft_view(cfg))  # before Ray, ranks or simulators: a full disk refuses the run here
        evaluator = OnlineEvaluator(sft_view(cfg), run_dir.root, identity)
        evaluator.check()
    except ConfigError as err:
        logger.error("invalid config: %s", err)
        return 2
    except InsufficientSpaceError as err:
        logger.error("refusing to start: %s", err)
        return 2
    try:
        RLRunner(cfg, resolved, run_dir.tensorboard, plan, evaluator, identity).run()
    except InsufficientSpaceError as err:
        logger.error("stopped: %s", err)
        return 2
    except PlacementError as err:  # known once Ray reports the cluster; Ray and the simulators are stopped by then
        logger.error("the ranks do not fit this cluster: %s", err)
        return 2
    logger.info("logs: %s | TensorBoard: tensorboard --logdir %s | checkpoints: %s", run_dir.log_file,
                run_dir.tensorboard, checkpoint_root(cfg))
    return 0


_PATH_FIELDS = (("rollout", "model", "model_path"), ("rollout", "model", "action_stats_path"),
                ("runner", "log_path"), ("runner", "resume_dir"), ("env", "python"))


def absolute_paths(resolved: dict[str, Any]) -> dict[str, Any]:
    """The config with its paths made absolute, so the actor and env workers agree whatever their cwd."""
    out = copy.deepcopy(resolved)
    for keys in _PATH_FIELDS:
        node = out
        for key in keys[:-1]:
            node = node.get(key) or {}
        if node.get(keys[-1]):
            node[keys[-1]] = str(Path(node[keys[-1]]).expanduser().resolve())
    return out


class RLRunner:
    """Owns the cluster, the actor rank, the env workers and the online evaluations of one run."""

    def __init__(self, cfg: RLConfig, resolved: dict[str, Any], tensorboard_dir: Path, plan: CheckpointPlan,
                 evaluator: OnlineEvaluator, identity: ModelIdentity, *, progress: bool = True) -> None:
        self.cfg = cfg
        self.view = sft_view(cfg)
        self.resolved = resolved
        self.tensorboard_dir = tensorboard_dir
        self.plan = plan
        self.evaluator = evaluator
        self.identity = identity
        self.progress = progress
        env = cfg.env
        tasks = env.env_worker_config(cfg.rollout.num_envs, cfg.rollout.executed_steps).resolved_task_ids()
        self.starts = [(task, init) for task in tasks for init in env.init_state_ids]
        self.history: list[dict[str, float]] = []

    def run(self) -> list[dict[str, float]]:
        """Train to ``runner.max_iterations``; returns every iteration's metrics run here."""
        with self.evaluator as evals, ScalarWriter(self.tensorboard_dir, prefix="rl") as writer:
            self._train(writer)
            evals.finish(writer)
        return self.history

    def _train(self, writer: ScalarWriter) -> None:
        from rlinf_cosmos3.workers.actor.fsdp_rl_worker import FSDPRLWorker

        cfg = self.cfg
        with Cluster(cfg.cluster) as cluster:
            logger.info("cluster: %s", cluster.resources())
            with WorkerGroup(FSDPRLWorker, cluster, 1, kwargs={"cfg": self.resolved},
                             gpus_per_rank=1 if cfg.cluster.use_gpus else 0, cpus_per_rank=cfg.cluster.cpus_per_rank,
                             name="actor") as actors:
                info = actors.call("setup", cfg.runner.resume_dir)[0]
                start = int(info["iteration"])
                counters = {name: float(info["counters"].get(name, 0)) for name in COUNTERS}
                critic, reference = info["value_head_params"], info["reference_params"]
                logger.info("actor ready on %s: %s trainable (actor.trainable=%s) / %s parameters%s%s%s", info["device"],
                            f"{info['trainable_params']:,}", cfg.actor.trainable, f"{info['total_params']:,}",
                            f", value head {critic:,} parameters" if critic else "",
                            f", KL reference: {reference:,} start weights on the host" if reference else "",
                            f"; resumed at iteration {start}" if start else "")
                if start >= cfg.runner.max_iterations:
                    logger.info("nothing to do: already at iteration %d >= runner.max_iterations", start)
                    return
                env_cfg = cfg.env.env_worker_config(cfg.rollout.num_envs, cfg.rollout.executed_steps,
                                                    final_observations=cfg.algorithm.name == "ppo")
                with start_env_workers(cluster, env_cfg, cfg.env.pipeline_stage_num, episodes=[],
                                       keep_processes=True) as envs:
                    envs.call("setup")
                    logger.info("env workers ready: %d envs = %d worker(s) x %d stage(s); %d starts (%d tasks x %d "
                                "init states), cap %d steps (incl. %d settle)", cfg.rollout.num_envs,
                                cfg.env.num_workers, cfg.env.pipeline_stage_num, len(self.starts),
                                len({t for t, _ in self.starts}), len(cfg.env.init_state_ids),
                                env_cfg.resolved_max_episode_steps(), env_cfg.num_settle_steps)
                    try:
                        self._loop(actors, envs, start, counters, writer)
                    finally:
                        envs.call("close")

    def _loop(self, actors: WorkerGroup, envs: WorkerGroup, start: int, counters: dict[str, float],
              writer: ScalarWriter) -> None:
        cfg = self.cfg
        total = cfg.runner.max_iterations
        bar = tqdm(total=total, initial=start, desc="rl", unit="it", dynamic_ncols=True, disable=not self.progress)
        started = time.perf_counter()
        for iteration in range(start + 1, total + 1):
            metrics = self._iteration(actors, envs, iteration, counters)
            metrics["wall_time_s"] = time.perf_counter() - started
            self.history.append(metrics)
            per_task = {k.removeprefix("task_success/"): v for k, v in metrics.items() if k.startswith("task_success/")}
            writer.log({k: v for k, v in metrics.items() if not k.startswith("task_success/")}, iteration)
            writer.log(per_task, iteration, prefix="rl_task_success")
            bar.update(1)
            bar.set_postfix(success=f"{metrics['success_rate']:.2f}", kl=f"{metrics.get('approx_kl', 0.0):.2g}")
            limit = cfg.runner.max_wall_time_s
            out_of_time = limit is not None and metrics["wall_time_s"] >= limit
            if iteration % cfg.runner.save_interval == 0 or iteration == total or out_of_time:
                writer.flush()
                saved = self._save(actors, iteration, counters)
                if self.evaluator.due(iteration):
                    self.evaluator.submit(iteration, saved)
            self.evaluator.poll(writer)
            if out_of_time and iteration < total:
                logger.info("runner.max_wall_time_s=%g reached after iteration %d of %d: stopped; continue with "
                            "runner.resume_dir=%s", limit, iteration, total, saved)
                break
        bar.close()

    def _iteration(self, actors: WorkerGroup, envs: WorkerGroup, iteration: int,
                   counters: dict[str, float]) -> dict[str, float]:
        cfg, alg = self.cfg, self.cfg.algorithm
        starts = round_starts(self.starts, cfg.rollout.num_envs // alg.group_size, cfg.runner.seed, iteration - 1)
        seeds = round_reset_seeds(starts, cfg.runner.seed, iteration - 1)
        episodes = [Episode(task, init, cfg.env.suite, seed) for (task, init), seed in zip(starts, seeds, strict=True)
                    for _ in range(alg.group_size)]
        logger.info("iteration %d/%d: rollout: %d episodes, %d starts x group %d (task, init state: %s)", iteration,
                    cfg.runner.max_iterations, len(episodes), len(starts), alg.group_size,
                    ", ".join(f"{t}/{i}" for t, i in starts))
        envs.call("assign", episodes)
        collected = RoundCollector(envs, actors.actors[0], stages=cfg.env.pipeline_stage_num, seed=cfg.runner.seed,
                                   iteration=iteration, num_episodes=len(episodes), progress=self.progress).run()
        kept = collected.episodes
        returns = [float(e.result.success_once) for e in kept]
        round_ = self._decisions(collected, returns)
        groups = len({(e.result.task_id, e.result.trial_id) for e in kept})
        groups_kept = len({(e.result.task_id, e.result.trial_id) for e, k in zip(kept, round_.episode_keep.tolist(),
                                                                                   strict=True) if k})
        logger.info("iteration %d: update: %d of %d decisions (%d of %d groups have signal), %d epochs of minibatches "
                    "of %d", iteration, len(round_.decision_ids), collected.kept_decisions,
                    groups_kept, groups, alg.update_epochs, alg.minibatch_size)
        update = actors.call("update", round_.decision_ids, round_.advantages, iteration,
                             round_.returns if alg.name == "ppo" else None)[0]
        steps = [e.result.steps - cfg.env.num_settle_steps for e in kept]
        counters["episodes"] += len(kept)
        counters["env_steps"] += sum(e.result.steps for e in kept)
        counters["decisions"] += collected.kept_decisions  # a crashed attempt's: not counted
        metrics = self._metrics(collected, round_.advantages, returns, steps, update, groups, groups_kept, counters)
        logger.info("iteration %d/%d: success %.3f over %d episodes, %.1f steps/episode, approx_kl %.3g, clip %.3f, "
                    "ratio %.4f (max %.4f), grad_norm %.3g | rollout %.1f s (%.2f episodes/s), update %.1f s | "
                    "totals: %d episodes, %d env steps", iteration, cfg.runner.max_iterations,
                    metrics["success_rate"], len(kept), metrics["episode_length"], metrics.get("approx_kl", 0.0),
                    metrics.get("clip_fraction", 0.0), metrics.get("ratio_mean", 1.0), metrics.get("ratio_max", 1.0),
                    metrics.get("grad_norm", 0.0), metrics["rollout_time_s"], metrics["episodes_per_s"],
                    metrics["update_time_s"], counters["episodes"], counters["env_steps"])
        return metrics

    def _decisions(self, collected: RoundResult, returns: list[float]) -> RoundDecisions:
        """The round's decisions to train on and their advantages: GRPO per start, or PPO's GAE per episode."""
        alg, kept = self.cfg.algorithm, collected.episodes
        if alg.name == "ppo":
            return ppo_decisions([bool(r) for r in returns], [e.decision_ids for e in kept], [e.values for e in kept],
                                 alg.gamma, alg.gae_lambda, final_values=[e.final_value for e in kept])
        return grpo_decisions(returns, [(e.result.task_id, e.result.trial_id) for e in kept],
                              [e.decision_ids for e in kept], alg.advantage_eps)

    @staticmethod
    def _metrics(collected: RoundResult, advantages: list[float], returns: list[float], steps: list[int],
                 update: dict[str, float], groups: int, groups_kept: int, counters: dict[str, float]
                 ) -> dict[str, float]:
        per_task: dict[int, list[float]] = defaultdict(list)
        for episode, ret in zip(collected.episodes, returns, strict=True):
            per_task[episode.result.task_id].append(ret)
        wall = max(collected.wall_s, 1e-9)
        metrics = {
            "success_rate": statistics.fmean(returns) if returns else 0.0,
            "episode_length": statistics.fmean(steps) if steps else 0.0,
            "episodes_total": counters["episodes"], "env_steps_total": counters["env_steps"],
            "decisions_total": counters["decisions"],
            "episodes": float(len(collected.episodes)), "failed_episodes": float(len(collected.failed)),
            "dropped_decisions": float(collected.dropped_decisions), "groups": float(groups),
            "bootstrapped_episodes": float(collected.final_values),
            "groups_with_signal": float(groups_kept),
            "advantage_std": statistics.pstdev(advantages) if advantages else 0.0,
            "rollout_time_s": collected.wall_s, "sample_time_s": collected.sample_s,
            "episodes_per_s": len(collected.episodes) / wall,
            "env_steps_per_s": sum(steps) / wall, "decisions_per_s": collected.decisions / wall,
            "update_time_s": update.pop("update_s"),
            **update,
        }
        metrics.update({f"task_success/{task}": statistics.fmean(v) for task, v in sorted(per_task.items())})
        return metrics

    def _save(self, actors: WorkerGroup, iteration: int, counters: dict[str, float]) -> Path:
        """Save ``global_step_<iteration>``, apply retention, and make sure the next save will fit (SFT's rules)."""
        return save_checkpoint_step(self.view, self.plan.size, iteration, actors, self.identity.to_json(),
                                    self.evaluator.protected(), unit="iterations", extra_args=(dict(counters),))
