"""The ``rollout.model`` and ``rollout.replay`` sections against what is on disk and what the pieces know.

:mod:`rlinf_cosmos3.config.rollout` and :mod:`rlinf_cosmos3.config.replay` check values; this module adds
what needs the library's own readers and tables: the converted model directory and its components, the
training identity it carries (:mod:`rlinf_cosmos3.models.cosmos3.identity`), the stats file (valid, made
with these settings, a gripper range that fits the convention), the action domain's width and horizon,
the gripper commands and rot6d decodes :mod:`rlinf_cosmos3.actions` implements, the caption framing, and
the replay backend's recorded dataset. Above ``config/`` so that configs import none of those
(docs/architecture.md, "Layers"); :mod:`rlinf_cosmos3.validation.eval` runs it for a whole eval config.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlinf_cosmos3.actions.gripper import GRIPPER_COMMANDS
from rlinf_cosmos3.actions.rotation import ROT6D_DECODES
from rlinf_cosmos3.config.base import ConfigError, require, require_one_of, require_path
from rlinf_cosmos3.config.model_settings import read_settings
from rlinf_cosmos3.config.replay import ReplayConfig
from rlinf_cosmos3.config.rollout import IDENTITY_CONFIG_FIELDS, ROLLOUT_SETTING_KEYS, RolloutModelConfig
from rlinf_cosmos3.data.recorded_episodes import ReplayEpisodesError, choose_episodes, read_recorded_episodes
from rlinf_cosmos3.models.cosmos3.captions import CONCAT_VIEW
from rlinf_cosmos3.models.cosmos3.components import missing_components
from rlinf_cosmos3.models.cosmos3.domains import ACTION_HORIZON, get_action_domain
from rlinf_cosmos3.models.cosmos3.identity import (
    IDENTITY_FILE,
    IdentityError,
    ModelIdentity,
    compare_identities,
    read_identity,
)
from rlinf_cosmos3.validation.stats import StatsFields, check_stats_file, load_stats

logger = logging.getLogger(__name__)


def validate_rollout_model(model: RolloutModelConfig, root: str = "rollout.model",
                           require_model: bool = True) -> RolloutModelConfig:
    """Every check of ``rollout.model`` before anything is served; raises :class:`ConfigError` naming the field.

    ``require_model=False`` (the model-free replay backend): ``model_path`` is only read when it names an
    existing directory (then its training identity is still compared with these settings).
    """
    has_model = require_model or (model.model_path not in ("", "???") and Path(model.model_path).is_dir())
    if has_model:
        model_dir = require_path(model.model_path if model.model_path != "???" else None, f"{root}.model_path",
                                 "Cosmos3 diffusers model", is_dir=True)
        for part in ("model_index.json", "text_tokenizer"):  # what the adapter reads; check_components: the rest
            require((model_dir / part).exists(), f"{root}.model_path",
                    f"'{model_dir}' has no {part}; it is not a converted diffusers directory",
                    "point it at the model_diffusers directory written by the checkpoint converter")
    model.validate(root)
    stats_path = require_path(model.action_stats_path if model.action_stats_path != "???" else None,
                              f"{root}.action_stats_path", "action stats file", is_dir=False)
    for name, allowed in (("gripper_command", GRIPPER_COMMANDS), ("rot6d_decode", ROT6D_DECODES)):
        require_one_of(getattr(model, name), allowed, f"{root}.{name}")
    require(model.caption_style != "cosmos_framework" or model.view_point == CONCAT_VIEW, f"{root}.view_point",
            f"'{model.view_point}' but caption_style 'cosmos_framework' describes a {CONCAT_VIEW} canvas",
            f"set {root}.view_point={CONCAT_VIEW}")
    if has_model:
        check_identity(model, root)
    check_stats_file(stats_path, model_stats_fields(root), read_settings(model, ROLLOUT_SETTING_KEYS))
    try:
        domain = get_action_domain(model.domain_name)
    except KeyError as err:
        raise ConfigError(f"{root}.domain_name", str(err.args[0])) from err
    require(model.raw_action_dim == domain.raw_action_dim, f"{root}.raw_action_dim",
            f"{model.raw_action_dim} but domain '{model.domain_name}' predicts {domain.raw_action_dim} channels",
            f"set it to {domain.raw_action_dim}")
    require(model.num_action_chunks == ACTION_HORIZON, f"{root}.num_action_chunks",
            f"{model.num_action_chunks} but the model predicts {ACTION_HORIZON} steps", f"set it to {ACTION_HORIZON}")
    return model


def check_components(model: RolloutModelConfig, root: str = "rollout.model") -> None:
    """Every part SGLang and the embedded pipeline load (transformer, VAE, scheduler too), before a
    server or worker tries to: a missing one fails there late, inside the server."""
    missing = missing_components(model.model_path)
    require(not missing, f"{root}.model_path",
            f"'{model.model_path}' has no {', '.join(missing)}; it is not a converted diffusers directory",
            "point it at the model_diffusers directory written by the checkpoint converter")


def served_identity(model: RolloutModelConfig) -> ModelIdentity:
    """The training identity these settings serve (the configured stats file hashed as it is now)."""
    return ModelIdentity.of(read_settings(model, ROLLOUT_SETTING_KEYS), model.action_stats_path)


def check_identity(model: RolloutModelConfig, root: str = "rollout.model", trained: ModelIdentity | None = None
                   ) -> ModelIdentity | None:
    """Compare the model directory's training identity (or ``trained``, the identity of a model still
    being trained) with the settings of ``model``.

    Raises :class:`ConfigError` listing every mismatch (config field, configured and trained
    value); returns the identity. A directory without one (a base model, or converted from a
    checkpoint saved before identities were recorded) passes with a warning that nothing could
    be checked.
    """
    model_dir = Path(model.model_path)
    source = (f"the model in '{model_dir}' was trained with other settings ({IDENTITY_FILE})" if trained is None
              else "the SFT run that makes the model trains with other settings")
    try:
        trained = trained or read_identity(model_dir)
    except IdentityError as err:
        raise ConfigError(f"{root}.model_path", f"unreadable training identity: {err}",
                          "convert the checkpoint again with toolkits/cosmos3/convert_checkpoint.py") from err
    if trained is None:
        logger.warning("'%s' has no %s (a base model, or converted from a checkpoint saved before identities "
                       "were recorded): %s.* cannot be checked against the training; make sure %s are the "
                       "training's", model_dir, IDENTITY_FILE, root, ", ".join(IDENTITY_CONFIG_FIELDS.values()))
        return None
    fields_ = {name: f"{root}.{field_name}" for name, field_name in IDENTITY_CONFIG_FIELDS.items()}
    mismatches = compare_identities(trained, served_identity(model), fields_)
    if not mismatches:
        return trained
    problems, fixes = [], []
    for m in mismatches:
        if m.field == "stats_sha256":
            where = f", then at '{trained.stats_path}'" if trained.stats_path else ""
            problems.append(f"{m.config_field}='{model.action_stats_path}' has sha256 {m.configured_value} but "
                            f"the model was trained with stats of sha256 {m.model_value}{where}")
            fixes.append(f"point {m.config_field} at the stats file the model was trained with")
        else:
            problems.append(f"{m.config_field}={m.configured_value!r} but the model was trained with "
                            f"{m.field}={m.model_value!r}")
            fixes.append(f"set {m.config_field}={m.model_value}")
    raise ConfigError(mismatches[0].config_field,
                      f"{source}: " + "; ".join(problems),
                      "; ".join(fixes) + "; or evaluate a model trained with these settings")


def model_stats_fields(root: str = "rollout.model") -> StatsFields:
    """How ``rollout.model`` (at ``root``) reports a stats file that does not fit it."""
    return StatsFields(
        stats=f"{root}.action_stats_path", convention=f"{root}.gripper_convention",
        fix="use the stats file the model was trained with",
        other_metadata="stats in '{path}' were computed with {key}={recorded} but the model uses {expected}",
        other_convention="'{convention}' but the stats in '{path}' were computed for '{recorded}'")


def check_replay(replay: ReplayConfig, pairs: list[tuple[int, int]], suite: str, num_settle_steps: int,
                 root: str = "rollout.replay") -> ReplayConfig:
    """The dataset, the stats file and a recorded episode for every (task, init state) of ``pairs``."""
    data = require_path(replay.dataset_root, f"{root}.dataset_root", "LeRobot dataset", is_dir=True)
    require((data / "meta" / "info.json").is_file(), f"{root}.dataset_root",
            f"'{data}' has no meta/info.json: not a LeRobot v3 dataset",
            "point it at a dataset written by toolkits/libero/record_demos.py")
    if replay.stats_path is not None:
        stats = require_path(replay.stats_path, f"{root}.stats_path", "action stats file", is_dir=False)
        load_stats(stats, f"{root}.stats_path", "use the stats file the SFT run trained with")
    replay.validate(root)
    try:
        chosen, missing = choose_episodes(read_recorded_episodes(data), pairs)
    except ReplayEpisodesError as err:
        raise ConfigError(f"{root}.dataset_root", str(err),
                          "record the dataset with toolkits/libero/record_demos.py") from err
    require(not missing, f"{root}.dataset_root",
            f"'{data}' has no recorded episode for (task, init state) {missing[:8]}"
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""),
            "restrict env.eval.task_ids / env.eval.init_state_ids to recorded episodes, or record them "
            "(toolkits/libero/record_demos.py)")
    for (task, init), episode in chosen.items():
        require(episode.suite in (None, suite), "env.eval.suite",
                f"'{suite}' but episode {episode.episode_index} (task {task}, init state {init}) was "
                f"recorded in '{episode.suite}'", f"set env.eval.suite={episode.suite}")
        require(episode.num_settle_steps in (None, num_settle_steps), "env.eval.num_settle_steps",
                f"{num_settle_steps} but episode {episode.episode_index} was recorded after "
                f"{episode.num_settle_steps} settle steps (its frame 0 is another scene)",
                f"set env.eval.num_settle_steps={episode.num_settle_steps}")
    failed = sorted(pair for pair, e in chosen.items() if e.success is False)
    if failed:
        logger.warning("%s: only failed recordings of (task, init state) %s: their replays cannot succeed",
                       data, failed[:8])
    return replay
