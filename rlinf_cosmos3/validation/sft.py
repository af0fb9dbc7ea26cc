"""An SFT config against what is on disk: every check before Ray starts, behind one entry point.

:mod:`rlinf_cosmos3.config.sft` declares the run's sections and checks their values
(:meth:`~rlinf_cosmos3.config.sft.SFTConfig.validate`); this module adds what needs the library's own
readers: the model directory's components, the stats file (valid, made with this run's fps, chunk length,
normalisation and gripper convention; :mod:`rlinf_cosmos3.validation.stats`), the dataset's
``meta/info.json`` and sample count, the checkpoint to resume and its training identity, the GPUs asked for,
the model settings the policy can be built with (diffusers' resolution tiers) and the latent cache. It sits
above ``config/`` so that configs import none of those readers (docs/architecture.md, "Layers").

:func:`preflight` is the driver's one call, before Ray; :func:`load_sft_config` (values and files, not the
sample count, identity, policy settings or cache) is what every rank runs on the config it is handed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlinf_cosmos3.checkpoint.layout import COMPLETE_MARKER, is_complete_checkpoint, parse_step
from rlinf_cosmos3.config.base import ConfigError, load_structured, require, require_path
from rlinf_cosmos3.config.data import DATA_SETTING_KEYS, LiberoDataConfig
from rlinf_cosmos3.config.model_settings import read_settings
from rlinf_cosmos3.config.sft import SFT_SETTING_KEYS, SFTConfig, sft_model_settings
from rlinf_cosmos3.data.checks import DatasetMismatchError, check_dataset_info, count_training_samples
from rlinf_cosmos3.models.cosmos3 import identity
from rlinf_cosmos3.models.cosmos3.components import missing_components
from rlinf_cosmos3.validation.stats import StatsFields, check_stats_file

logger = logging.getLogger(__name__)

DATASET_STATS = StatsFields(
    stats="data.dataset.stats_path", convention="data.dataset.gripper_convention",
    fix="recompute the stats with toolkits/cosmos3/compute_action_stats.py on this dataset",
    other_metadata="stats in '{path}' were computed with {key}={recorded!r} but the run uses {key}={expected!r}",
    other_convention="'{convention}' but the stats in '{path}' were computed for gripper_convention='{recorded}'")
"""How ``data.dataset`` reports a stats file that does not fit it (the ranks' reader checks the same)."""


def preflight(cfg: SFTConfig) -> None:
    """Every check of an SFT run, once, before Ray or any rank starts; raises :class:`ConfigError` naming the
    field and the fix on the first failure. The driver calls it on the config the ranks will get."""
    validate_sft_config(cfg)
    check_micro_batch_fits(cfg)  # counts the samples (meta/episodes): a micro-batch too large fails here
    check_resume_identity(cfg)
    check_policy_settings(cfg)
    check_latent_cache(cfg)


def load_sft_config(raw: Any, *, check_gpus: bool = True) -> SFTConfig:
    """Typed, validated config from a Hydra/OmegaConf object or plain dict (drops Hydra's own keys)."""
    cfg = load_structured(SFTConfig, raw)
    validate_sft_config(cfg, check_gpus=check_gpus)
    return cfg


def validate_sft_config(cfg: SFTConfig, *, check_gpus: bool = True) -> None:
    """The config's values, then the files it names; raises :class:`ConfigError` on the first violation."""
    cfg.validate()
    runner, model = cfg.runner, cfg.actor.model
    if runner.resume_dir:
        check_resume_dir(runner.resume_dir)

    model_dir = require_path(model.model_path, "actor.model.model_path", "Cosmos3 diffusers model", is_dir=True)
    missing = missing_components(model_dir)
    require(not missing, "actor.model.model_path",
            f"'{model_dir}' is not a complete diffusers Cosmos3 directory: it lacks {missing}",
            "point it at the model directory as downloaded (nvidia/Cosmos3-Nano layout: model_index.json, "
            "transformer/, vae/, text_tokenizer/, scheduler/) or one written by toolkits/cosmos3/make_tiny_model.py")

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


def training_identity(cfg: SFTConfig) -> identity.ModelIdentity:
    """What this run trains, written into every checkpoint: its model settings (validated against the
    data; the framing is the recipe's, which the policy composes its canvas for) and the stats file's hash."""
    return identity.ModelIdentity.of(sft_model_settings(cfg), Path(cfg.data.dataset.stats_path).resolve())


RESUME_IDENTITY_FIELDS = {**SFT_SETTING_KEYS, "view_point": "actor.model.view_point",
                          "stats_sha256": "data.dataset.stats_path"}
"""Identity field -> the SFT config field that sets it (``view_point`` is fixed by the policy, not configurable)."""


def check_resume_identity(cfg: SFTConfig) -> None:
    """A resumed run must train what the checkpoint was trained with: same model settings and stats file.

    Resuming "exactly" with another stats file or fps would continue the optimizer state on other
    targets, and the checkpoints written next would claim an identity the first steps did not have.
    A checkpoint saved before identities were recorded has none: nothing to compare.
    """
    if not cfg.runner.resume_dir:
        return
    try:
        trained = identity.read_identity(cfg.runner.resume_dir)
    except identity.IdentityError as err:
        raise ConfigError("runner.resume_dir", f"unreadable training identity: {err}",
                          "resume from a checkpoint this project wrote, or start a new run") from err
    if trained is None:
        return
    mismatches = identity.compare_identities(trained, training_identity(cfg), RESUME_IDENTITY_FIELDS)
    if mismatches:
        described = "; ".join(
            f"{m.config_field}: the checkpoint was trained with {m.field}={m.model_value!r}, this run has "
            f"{m.configured_value!r}" for m in mismatches)
        raise ConfigError("runner.resume_dir",
                          f"'{cfg.runner.resume_dir}' was trained with other settings ({identity.IDENTITY_FILE}): {described}",
                          "resume with the settings (and stats file) of the run that wrote it, or start a new run "
                          "without runner.resume_dir")


_SETTING_FIXES = {
    "resolution_tier": "use 256 for the 192x320 LIBERO canvas, or change canvas_height/canvas_width with it",
    "num_frames": "set actor.model.num_frames to actor.model.action_horizon + 1",
    "domain_name": "use a registered domain, or register the new one in models/cosmos3/domains.py",
}
"""The fix of each model setting the policy can refuse (:func:`~rlinf_cosmos3.models.cosmos3.configuration.
settings_problem`); the caption style's values are ``SFTConfig.validate``'s."""


def check_policy_settings(cfg: SFTConfig) -> None:
    """The ranks can build their policy with these settings: the check the policy runs, here before Ray
    (it needs diffusers' resolution tiers, so not in the light value checks)."""
    from rlinf_cosmos3.models.cosmos3.configuration import settings_problem

    model = cfg.actor.model
    problem = settings_problem(sft_model_settings(cfg), model.resolution_tier)
    if problem is not None:
        setting, why = problem
        key = SFT_SETTING_KEYS.get(setting, f"actor.model.{setting}")
        raise ConfigError(key, why, _SETTING_FIXES.get(setting))


def check_latent_cache(cfg: SFTConfig) -> None:
    """``data.latent_cache_dir``: a cache made from other inputs fails here, before any rank starts; logs
    whether the ranks will reuse it or build it."""
    if not cfg.data.latent_cache_dir:
        return
    from rlinf_cosmos3.data.latent_cache import check_cache
    from rlinf_cosmos3.models.cosmos3.configuration import sft_latent_cache_key

    reuse = check_cache(cfg.data.latent_cache_dir, sft_latent_cache_key(cfg, on_gpu=cfg.cluster.use_gpus))
    logger.info("latent cache %s: %s", cfg.data.latent_cache_dir,
                "reused" if reuse else "none yet: the ranks build it before the first step")


def check_micro_batch_fits(cfg: SFTConfig) -> int:
    """Every rank needs one full micro-batch per epoch (its loader drops a partial one); returns the samples.

    Counts the samples from the dataset's ``meta/episodes`` (lengths, success column): :func:`preflight`
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
