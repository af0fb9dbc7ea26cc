"""An eval config, validated once before a simulator or server starts: the sections' values and what is on disk.

:mod:`rlinf_cosmos3.config.eval` declares the run's sections and each checks its values; this module runs
them in order, with the checks that need the pieces (:mod:`rlinf_cosmos3.validation.rollout`: the model
directory, its training identity and the stats file against ``rollout.model``, the replay dataset) and
the GPUs asked for. :func:`load_eval_config` is what the eval driver, the online evaluation and the
benchmarks call; it mirrors :mod:`rlinf_cosmos3.validation.sft`.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlinf_cosmos3.config.base import load_structured, require
from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.validation.rollout import check_components, check_replay, validate_rollout_model


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
    rollout = cfg.rollout.validate("rollout")
    replay = rollout.rollout_backend == "replay"
    validate_rollout_model(rollout.model, "rollout.model", require_model=not replay)
    if not replay:
        check_components(rollout.model, "rollout.model")
    if rollout.rollout_backend == "sglang":
        rollout.sglang.validate("rollout.sglang")
    elif rollout.rollout_backend == "embedded":
        rollout.embedded.validate("rollout.embedded")
    env = cfg.env.eval
    env.validate(rollout.pipeline_stage_num, root="env.eval")
    env.check_interpreter("env.eval")
    chunk = rollout.model.num_action_chunks
    require(env.open_loop_steps is None or env.open_loop_steps <= chunk, "env.eval.open_loop_steps",
            f"{env.open_loop_steps} but a request returns {chunk} commands (rollout.model.num_action_chunks)",
            f"use 1..{chunk}, or null for the whole chunk")
    if replay:
        require(not env.multi_suite, "env.eval.suites",
                f"the replay backend answers from one recorded dataset, of one suite; got {env.resolved_suites()}",
                "replay one suite per run (env.eval.suite=<the dataset's suite>, env.eval.suites=null)")
        [suite] = env.resolved_suites()
        # the recordings played: from each episode's start (the source task's under a swap)
        pairs = sorted({(env.init_state_task(t), i) for t in env.resolved_task_ids(suite)
                        for i in env.resolved_init_state_ids()})
        check_replay(rollout.replay, pairs, suite, env.num_settle_steps)
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
