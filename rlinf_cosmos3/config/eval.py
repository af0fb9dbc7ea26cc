"""The evaluation run config: ``cluster``, ``runner``, ``env.eval`` and ``rollout``; validated once.

Mirrors the reference's ``libero_spatial_cosmos3_eval_sglang.yaml`` sections. ``validate_eval_config``
checks everything (paths, the converted model's training identity and the stats file vs the
``rollout.model`` settings, ``E % (W*S)``, chunking, GPUs) before a simulator or server starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlinf_cosmos3.config.base import load_structured, require
from rlinf_cosmos3.config.cluster import ClusterConfig
from rlinf_cosmos3.config.env import EnvEvalConfig
from rlinf_cosmos3.workers.rollout.config import (
    EmbeddedConfig,
    RolloutModelConfig,
    SGLangConfig,
)
from rlinf_cosmos3.workers.rollout.replay_config import ReplayConfig


@dataclass
class EvalRunnerConfig:
    """``runner``: where the run directory goes and what to report."""

    logs_dir: str = "logs"
    """Run directory ``<logs_dir>/<timestamp>-<config>/``: log, results.jsonl, summary.json, TensorBoard, videos."""
    experiment_name: str = "libero_eval_cosmos3"
    resume_dir: str | None = None
    """An earlier eval's run directory to finish instead of starting a new one: a run killed part way
    (a lost machine, a timeout) keeps the episodes its results.jsonl holds and runs only the missing
    ones, into that same directory (see :mod:`rlinf_cosmos3.runners.eval_resume`). The settings that
    define the episodes must equal those in its config.yaml."""

    def validate(self, root: str = "runner") -> None:
        """``resume_dir``, when set, must be an eval run directory (results.jsonl and config.yaml)."""
        if self.resume_dir is None:
            return
        # = tracking.results_file.RESULTS_FILE (not imported: config sits below tracking; test_eval_resume checks the name)
        for name in ("results.jsonl", "config.yaml"):
            require((Path(self.resume_dir) / name).is_file(), f"{root}.resume_dir",
                    f"'{self.resume_dir}' has no {name}: not an eval run directory",
                    "give the run directory logs/<timestamp>-<config> that evaluations/run_eval.sh printed, "
                    "or leave runner.resume_dir unset to start a new run")


@dataclass
class EnvConfig:
    """``env``: the simulator side (only LIBERO for now)."""

    eval: EnvEvalConfig = field(default_factory=EnvEvalConfig)


BACKENDS = ("sglang", "embedded", "replay")
"""``rollout.rollout_backend``: the names ``workers/rollout/factory.make_backend`` builds."""


@dataclass
class RolloutConfig:
    """``rollout``: the policy side: which backend, the model's identity, pipelining."""

    rollout_backend: str = "sglang"
    """``sglang`` (one server per GPU), ``embedded`` (diffusers pipeline in Ray actors) or ``replay`` (no
    model: a recorded dataset's actions, to check the eval's conventions; docs/eval.md)."""
    pipeline_stage_num: int = 2
    """``S``: env groups per env worker; while one is simulated, the others' requests are served (2, as
    the reference eval: simulation and inference overlap; 1 runs them in turn)."""
    model: RolloutModelConfig = field(default_factory=RolloutModelConfig)
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    embedded: EmbeddedConfig = field(default_factory=EmbeddedConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    @property
    def batching_max_size(self) -> int:
        if self.rollout_backend == "replay":
            return self.replay.batching_max_size
        return self.sglang.batching_max_size if self.rollout_backend == "sglang" else self.embedded.batching_max_size


@dataclass
class EvalConfig:
    """The whole evaluation run."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runner: EvalRunnerConfig = field(default_factory=EvalRunnerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


def load_eval_config(raw: Any, *, check_gpus: bool = True) -> EvalConfig:
    """Typed, validated config from a Hydra/OmegaConf object or a plain dict. The replay backend runs
    without a model: there an unset ``rollout.model.model_path`` (``???``) is not an error."""
    raw = raw.copy() if isinstance(raw, DictConfig) else OmegaConf.create(raw)
    if OmegaConf.select(raw, "rollout.rollout_backend") == "replay" and \
            OmegaConf.select(raw, "rollout.model.model_path", default="???") in (None, "???"):
        OmegaConf.update(raw, "rollout.model.model_path", "", merge=True)  # None: unset (???) in the YAML
    cfg = load_structured(EvalConfig, raw)
    validate_eval_config(cfg, check_gpus=check_gpus)
    return cfg


def validate_eval_config(cfg: EvalConfig, *, check_gpus: bool = True) -> None:
    """Every rule of an eval run; raises :class:`ConfigError` naming the field and the fix."""
    cfg.cluster.validate("cluster")
    cfg.runner.validate("runner")
    rollout = cfg.rollout
    require(rollout.rollout_backend in BACKENDS, "rollout.rollout_backend",
            f"unknown backend '{rollout.rollout_backend}'", f"use one of {list(BACKENDS)}")
    require(rollout.pipeline_stage_num >= 1, "rollout.pipeline_stage_num",
            f"must be >= 1, got {rollout.pipeline_stage_num}")
    replay = rollout.rollout_backend == "replay"
    rollout.model.validate("rollout.model", require_model=not replay)
    if not replay:
        rollout.model.check_components("rollout.model")
    if rollout.rollout_backend == "sglang":
        rollout.sglang.validate("rollout.sglang")
    elif rollout.rollout_backend == "embedded":
        rollout.embedded.validate("rollout.embedded")
    env = cfg.env.eval
    env.validate(rollout.pipeline_stage_num, root="env.eval")
    env.check_interpreter("env.eval")
    if replay:
        require(not env.multi_suite, "env.eval.suites",
                f"the replay backend answers from one recorded dataset, of one suite; got {env.resolved_suites()}",
                "replay one suite per run (env.eval.suite=<the dataset's suite>, env.eval.suites=null)")
        [suite] = env.resolved_suites()
        pairs = [(t, i) for t in env.resolved_task_ids(suite) for i in env.resolved_init_state_ids()]
        rollout.replay.validate(pairs, suite, env.num_settle_steps)
        return  # no GPU: nothing is served
    if check_gpus:
        _check_gpus(cfg)


def _check_gpus(cfg: EvalConfig) -> None:
    rollout = cfg.rollout
    if rollout.rollout_backend == "sglang":
        if rollout.sglang.attaches:
            return  # the servers run elsewhere, on their own GPUs
        needed, field_name = rollout.sglang.num_servers * rollout.sglang.gpus_per_server, "rollout.sglang.num_servers"
    else:
        needed, field_name = rollout.embedded.num_workers * rollout.embedded.gpus_per_worker, "rollout.embedded.num_workers"
    if needed == 0 or cfg.cluster.address is not None:
        return  # CPU serving, or a joined cluster whose GPUs the placement check counts
    import torch

    available = torch.cuda.device_count()
    require(available >= needed, field_name, f"needs {needed} GPUs but this machine has {available}",
            "lower the server count, or set gpus_per_server/gpus_per_worker=0 to serve on CPU")


HYDRA_SCHEMA = "eval_schema"
"""Name of :class:`EvalConfig` in Hydra's config store: the first entry of an eval YAML's ``defaults``, so
every field of the schema can be set from the command line and an unknown key is an error."""


def register_hydra_schema() -> None:
    """Put :class:`EvalConfig` into Hydra's config store (idempotent; done when this module is imported)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=HYDRA_SCHEMA, node=EvalConfig)


register_hydra_schema()
