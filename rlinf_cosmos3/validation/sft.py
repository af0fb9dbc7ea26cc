"""An SFT config against what is on disk: the checks before any worker starts that read files.

:mod:`rlinf_cosmos3.config.sft` declares the run's sections and checks their values; this module adds
what needs the library's own readers: the model directory's components, the stats file (valid, made with
this run's fps, chunk length, normalisation and gripper convention; :mod:`rlinf_cosmos3.validation.stats`),
the dataset's ``meta/info.json`` and sample count, the checkpoint to resume, and the GPUs asked for. It
sits above ``config/`` so that configs import none of those readers (docs/architecture.md, "Layers");
:func:`load_sft_config` is what the driver and every rank call.
"""

from __future__ import annotations

from typing import Any

from rlinf_cosmos3.checkpoint.layout import COMPLETE_MARKER, is_complete_checkpoint, parse_step
from rlinf_cosmos3.config.base import ConfigError, load_structured, require, require_path
from rlinf_cosmos3.config.data import DATA_SETTING_KEYS, LiberoDataConfig
from rlinf_cosmos3.config.model_settings import read_settings
from rlinf_cosmos3.config.sft import SFTConfig, check_dataset_values, check_online_eval, check_sft_values
from rlinf_cosmos3.data.checks import DatasetMismatchError, check_dataset_info, count_training_samples
from rlinf_cosmos3.models.cosmos3.components import missing_components
from rlinf_cosmos3.validation.stats import StatsFields, check_stats_file

DATASET_STATS = StatsFields(
    stats="data.dataset.stats_path", convention="data.dataset.gripper_convention",
    fix="recompute the stats with toolkits/cosmos3/compute_action_stats.py on this dataset",
    other_metadata="stats in '{path}' were computed with {key}={recorded!r} but the run uses {key}={expected!r}",
    other_convention="'{convention}' but the stats in '{path}' were computed for gripper_convention='{recorded}'")
"""How ``data.dataset`` reports a stats file that does not fit it (the ranks' reader checks the same)."""


def load_sft_config(raw: Any, *, check_gpus: bool = True) -> SFTConfig:
    """Typed, validated config from a Hydra/OmegaConf object or plain dict (drops Hydra's own keys)."""
    cfg = load_structured(SFTConfig, raw)
    validate_sft_config(cfg, check_gpus=check_gpus)
    return cfg


def validate_sft_config(cfg: SFTConfig, *, check_gpus: bool = True) -> None:
    """All rules of an SFT run, values first, then what is on disk; raises :class:`ConfigError` on the
    first violation."""
    check_sft_values(cfg)
    runner, model = cfg.runner, cfg.actor.model
    if runner.resume_dir:
        check_resume_dir(runner.resume_dir)
    if runner.eval_interval is not None:
        check_online_eval(runner)

    model_dir = require_path(model.model_path, "actor.model.model_path", "Cosmos3 diffusers model", is_dir=True)
    missing = missing_components(model_dir)
    require(not missing, "actor.model.model_path",
            f"'{model_dir}' is not a complete diffusers Cosmos3 directory: it lacks {missing}",
            "point it at the model directory as downloaded (nvidia/Cosmos3-Nano layout: model_index.json, "
            "transformer/, vae/, text_tokenizer/, scheduler/) or one written by toolkits/cosmos3/make_tiny_model.py")

    check_dataset_values(cfg)
    data = cfg.data.dataset
    require_path(data.root, "data.dataset.root", "LeRobot dataset", is_dir=True)
    stats_path = require_path(data.stats_path, "data.dataset.stats_path", "action stats file", is_dir=False)
    check_stats_file(stats_path, DATASET_STATS, read_settings(data, DATA_SETTING_KEYS))
    _check_dataset(data)

    if check_gpus and cfg.cluster.use_gpus and cfg.cluster.address is None:
        available = _local_gpu_count()
        require(available >= cfg.cluster.num_gpus_per_node, "cluster.num_gpus_per_node",
                f"requested {cfg.cluster.num_gpus_per_node} GPUs per node but this machine has {available}",
                "set cluster.num_gpus_per_node=0 to train on CPU, or run on a GPU machine")


def check_resume_dir(value: str) -> None:
    """Only a complete checkpoint is resumed from: the exact ``global_step_<N>`` name and its marker."""
    resume = require_path(value, "runner.resume_dir", "checkpoint to resume", is_dir=True)
    fix = ("point it at a complete checkpoint, .../checkpoints/global_step_<N> with a COMPLETE file "
           "(the newest complete one of a run is the highest such N)")
    require(parse_step(resume) is not None, "runner.resume_dir",
            f"'{resume}' is not a global_step_<N> directory"
            + (" (it is the temporary directory of a save that did not finish)" if ".tmp-" in resume.name
               else " (it is a checkpoint being deleted)" if ".old-" in resume.name else ""), fix)
    require(is_complete_checkpoint(resume), "runner.resume_dir",
            f"'{resume}' is not a complete checkpoint: it has no {COMPLETE_MARKER} marker (the save that wrote it "
            "did not finish, or the directory was copied partially)", fix)


def check_micro_batch_fits(cfg: SFTConfig) -> int:
    """Every rank needs one full micro-batch per epoch (its loader drops a partial one); returns the samples.

    Counts the samples from the dataset's ``meta/episodes`` (lengths, success column): the SFT driver
    runs it right after :func:`validate_sft_config`, before Ray, so a micro-batch larger than the data
    fails there and not in every rank's first step.
    """
    data, world, micro = cfg.data.dataset, cfg.cluster.world_size, cfg.actor.micro_batch_size
    try:
        samples = count_training_samples(data)
    except DatasetMismatchError as err:
        raise ConfigError(f"data.dataset.{err.field}", err.problem, err.fix) from err
    per_rank = -(-samples // world)
    require(per_rank >= micro, "actor.micro_batch_size",
            f"{micro} is more than the {per_rank} sample(s) each of the {world} ranks gets per epoch: the dataset "
            f"at '{data.root}' gives {samples} training sample(s) with these data.dataset settings",
            f"set actor.micro_batch_size to at most {per_rank} (and actor.global_batch_size to a multiple of it "
            "x the world size), or train on more episodes")
    return samples


def _check_dataset(data: LiberoDataConfig) -> None:
    """The dataset's ``meta/info.json`` against ``data.dataset`` (cameras, action/state, fps, episodes).

    The reader's own checks, run here so that a wrong dataset stops the driver before Ray or any
    rank starts, instead of failing in every rank or in the first training step.
    """
    try:
        check_dataset_info(data)
    except DatasetMismatchError as err:
        raise ConfigError(f"data.dataset.{err.field}", err.problem, err.fix) from err


def _local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()
