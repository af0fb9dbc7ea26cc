"""An RL config against what is on disk: the checks before Ray, a simulator or a model starts.

:mod:`rlinf_cosmos3.config.rl` checks the values; this module adds what needs the pieces' readers, reusing the
eval's and SFT's checks rather than restating them: ``rollout.model`` as an eval checks it (the model directory
and its components, its ``model_identity.json`` against the configured settings and stats file, the stats file
itself: :func:`~rlinf_cosmos3.validation.rollout.validate_rollout_model`), the simulator environment, the
checkpoint to resume (SFT's complete-checkpoint rule, plus: written by an RL run, for this model), the online
evaluation's schedule and the GPUs. :func:`load_rl_config` is what the driver and the actor rank call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_cosmos3.checkpoint.layout import TRAINER_STATE_FILE, actor_dir
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.config.base import ConfigError, load_structured, require
from rlinf_cosmos3.config.rl import RLConfig, sft_view
from rlinf_cosmos3.config.rollout import IDENTITY_CONFIG_FIELDS
from rlinf_cosmos3.config.sft import check_online_eval
from rlinf_cosmos3.models.cosmos3.identity import IdentityError, compare_identities, read_identity
from rlinf_cosmos3.validation.rollout import check_components, served_identity, validate_rollout_model
from rlinf_cosmos3.validation.sft import check_resume_dir

RL_STATE_KEY = "rl"
"""Key of an RL checkpoint's own counters in ``trainer_state.json``'s ``extra`` (iteration, episodes, env steps):
how a resume tells an RL checkpoint from an SFT one."""
VALUE_HEAD_FILE = "value_head.pt.b64"
"""A PPO run's critic (value head and its AdamW state, ``rl.critic.Critic.to_text``) at the root of its checkpoints'
``global_step_<N>/``, written by the same atomic save as the model; GRPO checkpoints have none."""


def load_rl_config(raw: Any, *, check_gpus: bool = True) -> RLConfig:
    """Typed, validated config from a Hydra/OmegaConf object or plain dict (drops Hydra's own keys)."""
    cfg = load_structured(RLConfig, raw)
    validate_rl_config(cfg, check_gpus=check_gpus)
    return cfg


def validate_rl_config(cfg: RLConfig, *, check_gpus: bool = True) -> None:
    """All rules of an RL run, values first, then what is on disk; raises :class:`ConfigError` on the first."""
    cfg.validate()
    model = cfg.rollout.model
    require(cfg.rollout.executed_steps <= model.num_action_chunks, "rollout.executed_steps",
            f"{cfg.rollout.executed_steps} exceeds the model's chunk of {model.num_action_chunks} steps",
            f"use at most {model.num_action_chunks}")
    cfg.env.env_worker_config(cfg.rollout.num_envs, cfg.rollout.executed_steps).check_interpreter("env")
    validate_rollout_model(model, "rollout.model")
    check_components(model, "rollout.model")
    if cfg.runner.resume_dir:
        check_resume_dir(cfg.runner.resume_dir)
        check_rl_checkpoint(cfg)
    if cfg.runner.eval_interval is not None:
        check_online_eval(sft_view(cfg).runner)
    if check_gpus and cfg.cluster.use_gpus and cfg.cluster.address is None:
        import torch

        available = torch.cuda.device_count()
        require(available >= cfg.cluster.num_gpus_per_node, "cluster.num_gpus_per_node",
                f"requested {cfg.cluster.num_gpus_per_node} GPU(s) but this machine has {available}",
                "set cluster.num_gpus_per_node=0 (and actor.precision=fp32) to run on CPU, or run on a GPU machine")


def check_rl_checkpoint(cfg: RLConfig) -> None:
    """``runner.resume_dir`` must be an RL checkpoint of this model and algorithm: its counters are there, it holds
    a value head exactly when the run is PPO, and its identity (the model settings and stats the run trains with)
    equals the one ``rollout.model`` states."""
    resume = Path(cfg.runner.resume_dir)
    state = TrainerState.read(actor_dir(resume) / TRAINER_STATE_FILE)
    require(RL_STATE_KEY in state.extra, "runner.resume_dir",
            f"'{resume}' is not a checkpoint of an RL run (an SFT checkpoint's optimizer state is for another "
            "objective and trainable part)",
            "to start RL from an SFT checkpoint, convert it (toolkits/cosmos3/convert_checkpoint.py) and set "
            "rollout.model.model_path to the converted directory; runner.resume_dir only continues an RL run")
    check_same_algorithm(cfg, resume)
    try:
        trained = read_identity(resume)
    except IdentityError as err:
        raise ConfigError("runner.resume_dir", f"unreadable training identity: {err}",
                          "resume from a checkpoint this project wrote, or start a new run") from err
    if trained is None:
        return
    fields_ = {name: f"rollout.model.{key}" for name, key in IDENTITY_CONFIG_FIELDS.items()}
    mismatches = compare_identities(trained, served_identity(cfg.rollout.model), fields_)
    if mismatches:
        described = "; ".join(f"{m.config_field}: the checkpoint was trained with {m.field}={m.model_value!r}, "
                              f"this run has {m.configured_value!r}" for m in mismatches)
        raise ConfigError("runner.resume_dir", f"'{resume}' was trained with other settings: {described}",
                          "resume with the rollout.model settings (and stats file) of the run that wrote it")


def check_same_algorithm(cfg: RLConfig, resume: Path) -> None:
    """A resume continues the run that wrote the checkpoint: PPO needs the value head it saved (a GRPO checkpoint has
    none), and GRPO would silently drop a PPO run's critic."""
    has_critic = (resume / VALUE_HEAD_FILE).is_file()
    if cfg.algorithm.name == "ppo":
        require(has_critic, "runner.resume_dir",
                f"'{resume}' has no value head ({VALUE_HEAD_FILE}): it was written by a GRPO run, and PPO resumes "
                "its critic with the policy",
                "resume it with algorithm.name=grpo, or start PPO from its converted model "
                "(toolkits/cosmos3/convert_checkpoint.py, then rollout.model.model_path)")
    else:
        require(not has_critic, "runner.resume_dir",
                f"'{resume}' was written by a PPO run (it holds {VALUE_HEAD_FILE}); algorithm.name="
                f"{cfg.algorithm.name} would drop its critic", "resume it with algorithm.name=ppo")
