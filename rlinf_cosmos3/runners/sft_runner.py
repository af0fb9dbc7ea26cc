"""The SFT driver: validate, start the ranks, loop the steps, log, checkpoint, stop cleanly.

The driver never touches the model. Ranks (:class:`FSDPSFTWorker` Ray actors) hold the FSDP2
shards; each step the driver asks every rank for one optimizer step and logs rank 0's metrics
(losses are already averaged over ranks there). Checkpoints are written by all ranks together.
Before Ray starts, and before and after each save, the driver checks that the checkpoint directory
can take the next checkpoint (:mod:`rlinf_cosmos3.runners.checkpoint_space`); after each save it
deletes checkpoints beyond ``runner.max_checkpoints_to_keep``.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from rlinf_cosmos3.checkpoint.errors import InsufficientSpaceError
from rlinf_cosmos3.checkpoint.layout import step_dir_name
from rlinf_cosmos3.cluster import Cluster, PlacementError, WorkerGroup
from rlinf_cosmos3.config import ConfigError, load_structured
from rlinf_cosmos3.config.sft import SFTConfig
from rlinf_cosmos3.runners.checkpoint_save import save_checkpoint_step
from rlinf_cosmos3.runners.checkpoint_space import (
    CheckpointPlan,
    checkpoint_root,
    plan_checkpoints,
)
from rlinf_cosmos3.runners.checkpoint_space import preflight as disk_preflight
from rlinf_cosmos3.runners.online_eval import OnlineEvaluator
from rlinf_cosmos3.tracking import ScalarWriter, start_run
from rlinf_cosmos3.validation.sft import preflight, training_identity

logger = logging.getLogger("rlinf_cosmos3.sft")

RUN_LOG_NAME = "run_embodiment.log"


__all__ = ["SFTRunner", "absolute_paths", "checkpoint_root", "run_sft"]


def run_sft(raw_cfg: DictConfig | dict[str, Any], config_name: str) -> int:
    """Run SFT from a Hydra config; returns a process exit code (0 ok, 2 bad config or too little disk)."""
    resolved, run_dir = start_run(raw_cfg, config_name, RUN_LOG_NAME)
    try:
        # Typed as written first: absolute_paths would make a missing '???' a path, and crash on a wrong type.
        load_structured(SFTConfig, resolved)
        resolved = absolute_paths(resolved)
        cfg = load_structured(SFTConfig, resolved)  # as the ranks get it
        preflight(cfg)  # every config check, once
        plan = disk_preflight(cfg)  # before Ray, ranks or GPUs: a full disk refuses the run here
        evaluator = OnlineEvaluator(cfg, run_dir.root, training_identity(cfg))
        evaluator.check()  # runner.eval_interval: the eval config must accept this run's checkpoints
    except ConfigError as err:
        logger.error("invalid config: %s", err)
        return 2
    except InsufficientSpaceError as err:
        logger.error("refusing to start: %s", err)
        return 2
    try:
        SFTRunner(cfg, resolved, tensorboard_dir=run_dir.tensorboard, plan=plan, evaluator=evaluator).run()
    except InsufficientSpaceError as err:
        logger.error("stopped: %s", err)
        return 2
    except PlacementError as err:  # known once Ray reports the cluster; Ray is stopped by then
        logger.error("the ranks do not fit this cluster: %s", err)
        return 2
    logger.info("logs: %s | TensorBoard: tensorboard --logdir %s | checkpoints: %s",
                run_dir.log_file, run_dir.tensorboard, checkpoint_root(cfg))
    return 0


_PATH_FIELDS = (("actor", "model", "model_path"), ("data", "dataset", "root"), ("data", "dataset", "stats_path"),
                ("data", "latent_cache_dir"), ("runner", "log_path"), ("runner", "resume_dir"))


def absolute_paths(resolved: dict[str, Any]) -> dict[str, Any]:
    """The config with its paths made absolute, so ranks (Ray actors) agree whatever their cwd."""
    out = copy.deepcopy(resolved)
    for keys in _PATH_FIELDS:
        node = out
        for key in keys[:-1]:
            node = node.get(key, {})
        if node.get(keys[-1]):
            node[keys[-1]] = str(Path(node[keys[-1]]).expanduser().resolve())
    return out


class SFTRunner:
    """Owns the cluster, the actor group and the online evaluations of one run.

    ``evaluator`` (``runner.eval_interval``): :func:`run_sft` hands one it has checked; without one the
    runner makes its own, unchecked (a bad eval config then shows as failed evaluations).
    """

    def __init__(self, cfg: SFTConfig, resolved: dict[str, Any], tensorboard_dir: Path,
                 plan: CheckpointPlan | None = None, evaluator: OnlineEvaluator | None = None) -> None:
        self.cfg = cfg
        self.resolved = resolved
        self.tensorboard_dir = tensorboard_dir
        self.identity = training_identity(cfg)
        self.plan = plan or plan_checkpoints(cfg)
        self.evaluator = evaluator or OnlineEvaluator(cfg, Path(tensorboard_dir).parent, self.identity)

    def run(self) -> list[dict[str, float]]:
        """Train to ``runner.max_steps``; returns rank 0's metrics of every step run here.

        Online evaluations still running when training ends are waited for after the ranks and Ray
        are stopped (their GPU memory is free by then)."""
        with self.evaluator as evals, ScalarWriter(self.tensorboard_dir, prefix="train") as writer:
            history = self._train(writer)
            evals.finish(writer)
        return history

    def _train(self, writer: ScalarWriter) -> list[dict[str, float]]:
        from rlinf_cosmos3.workers.actor.fsdp_sft_worker import FSDPSFTWorker

        cfg = self.cfg
        history: list[dict[str, float]] = []
        with Cluster(cfg.cluster) as cluster:
            logger.info("cluster: %s", cluster.resources())
            logger.info("starting %d %s ranks (%s)", cfg.cluster.world_size, FSDPSFTWorker.__name__,
                        "NCCL on GPUs" if cfg.cluster.use_gpus else "gloo on CPU")
            with WorkerGroup(
                FSDPSFTWorker, cluster, cfg.cluster.world_size,
                kwargs={"cfg": self.resolved},
                num_nodes=cfg.cluster.num_nodes,
                gpus_per_rank=1 if cfg.cluster.use_gpus else 0,
                cpus_per_rank=cfg.cluster.cpus_per_rank,
                name="actor",
            ) as actors:
                info = actors.call("setup", cfg.runner.resume_dir)[0]
                start = int(info["global_step"])
                logger.info("model ready: %s trainable / %s total parameters, %d training samples, "
                            "%d micro-batches per step", f"{info['trainable_params']:,}",
                            f"{info['total_params']:,}", info["num_samples"], info["grad_accum_steps"])
                if start:
                    logger.info("resumed from %s at global step %d", cfg.runner.resume_dir, start)
                if info["trainable_params"] != self.plan.trainable_params:
                    logger.warning("the ranks train %d parameters but the checkpoint size was estimated for %d",
                                   info["trainable_params"], self.plan.trainable_params)
                if start >= cfg.runner.max_steps:
                    logger.info("nothing to do: already at step %d >= runner.max_steps", start)
                    return history
                history = self._loop(actors, start, writer)
        return history

    def _loop(self, actors: WorkerGroup, start: int, writer: ScalarWriter) -> list[dict[str, float]]:
        cfg = self.cfg.runner
        history: list[dict[str, float]] = []
        bar = tqdm(total=cfg.max_steps, initial=start, desc="sft", unit="step", dynamic_ncols=True)
        started = time.monotonic()
        for step in range(start + 1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            metrics = dict(actors.call("train_step")[0])
            metrics["step_time_s"] = time.perf_counter() - t0
            metrics["samples_per_s"] = self.cfg.actor.global_batch_size / metrics["step_time_s"]
            history.append(metrics)
            writer.log(metrics, step)
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", lr=f"{metrics['lr']:.2e}")
            if step % cfg.log_interval == 0 or step == cfg.max_steps:
                logger.info("step %d/%d %s", step, cfg.max_steps,
                            " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
            out_of_time = cfg.max_wall_time_s is not None and time.monotonic() - started >= cfg.max_wall_time_s
            if step % cfg.save_interval == 0 or step == cfg.max_steps or out_of_time:
                writer.flush()
                saved = self._save(actors, step)
                if self.evaluator.due(step):
                    self.evaluator.submit(step, saved)
            self.evaluator.poll(writer)
            if out_of_time and step < cfg.max_steps:
                logger.info("runner.max_wall_time_s=%g reached after step %d of %d: stopped; continue with "
                            "runner.resume_dir=%s", cfg.max_wall_time_s, step, cfg.max_steps,
                            checkpoint_root(self.cfg) / step_dir_name(step))
                break
        bar.close()
        return history

    def _save(self, actors: WorkerGroup, step: int) -> Path:
        """Save ``global_step_<step>``, apply retention, and make sure the next save will fit; returns its path.

        Checking right after a save means a disk that cannot take the next checkpoint stops the
        run while nothing is lost, instead of ``save_interval`` steps later in the middle of a write.
        """
        return save_checkpoint_step(self.cfg, self.plan.size, step, actors, self.identity.to_json(),
                                    self.evaluator.protected())
