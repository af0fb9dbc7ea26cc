"""The evaluation run config: ``cluster``, ``runner``, ``env.eval`` and ``rollout``.

Mirrors the reference's ``libero_spatial_cosmos3_eval_sglang.yaml`` sections; each section's ``validate()``
checks its values. :func:`rlinf_cosmos3.validation.eval.load_eval_config` runs them all, with what needs
the pieces (the converted model's training identity and the stats file vs the ``rollout.model``
settings, the model's components, the replay dataset, GPUs), before a simulator or server starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlinf_cosmos3.config.base import require
from rlinf_cosmos3.config.cluster import ClusterConfig
from rlinf_cosmos3.config.env import EnvEvalConfig
from rlinf_cosmos3.config.replay import ReplayConfig
from rlinf_cosmos3.config.rollout import EmbeddedConfig, RolloutModelConfig, SGLangConfig


def is_plain_name(name: str) -> bool:
    """A name that makes one directory: not empty, no path separator, not ``.`` or ``..``."""
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


@dataclass
class EvalRunnerConfig:
    """``runner``: where the run directory goes and what to report."""

    logs_dir: str = "logs"
    """Run directory ``<logs_dir>/<timestamp>-<experiment_name>/``: log, results.jsonl, summary.json, TensorBoard,
    videos."""
    experiment_name: str | None = None
    """The run directory's name after its timestamp; unset: the config's name (``libero_spatial_cosmos3_eval_tiny``
    gives ``logs/<timestamp>-libero_spatial_cosmos3_eval_tiny/``)."""
    resume_dir: str | None = None
    """An earlier eval's run directory to finish instead of starting a new one: a run killed part way
    (a lost machine, a timeout) keeps the episodes its results.jsonl holds and runs only the missing
    ones, into that same directory (see :mod:`rlinf_cosmos3.runners.eval_resume`). The settings that
    define the episodes must equal those in its config.yaml."""

    def validate(self, root: str = "runner") -> None:
        """``experiment_name``, when set, is one plain directory name; ``resume_dir``, when set, must be an eval
        run directory (results.jsonl and config.yaml)."""
        if self.experiment_name is not None:
            require(is_plain_name(self.experiment_name), f"{root}.experiment_name",
                    f"'{self.experiment_name}' is not a plain directory name",
                    "use letters, digits, '-', '_' or '.', without '/'; runner.logs_dir says where runs go")
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

    def validate(self, root: str = "rollout") -> RolloutConfig:
        """The backend's name and the stage count (each sub-section checks its own values)."""
        require(self.rollout_backend in BACKENDS, f"{root}.rollout_backend",
                f"unknown backend '{self.rollout_backend}'", f"use one of {list(BACKENDS)}")
        require(self.pipeline_stage_num >= 1, f"{root}.pipeline_stage_num",
                f"must be >= 1, got {self.pipeline_stage_num}")
        return self


@dataclass
class EvalConfig:
    """The whole evaluation run."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runner: EvalRunnerConfig = field(default_factory=EvalRunnerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


HYDRA_SCHEMA = "eval_schema"
"""Name of :class:`EvalConfig` in Hydra's config store: the first entry of an eval YAML's ``defaults``, so
every field of the schema can be set from the command line and an unknown key is an error."""


def register_hydra_schema() -> None:
    """Put :class:`EvalConfig` into Hydra's config store (idempotent; done when this module is imported)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=HYDRA_SCHEMA, node=EvalConfig)


register_hydra_schema()
