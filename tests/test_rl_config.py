"""The RL recipe's schema (rlinf_cosmos3.config.rl): defaults are the recipe, bad values name the field and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlinf_cosmos3.config.base import ConfigError, load_structured
from rlinf_cosmos3.config.rl import GENERATION_TOWER_KEYS, RLConfig, trainable_keys

REPO = Path(__file__).resolve().parent.parent


def test_defaults_are_the_recipe_and_valid() -> None:
    cfg = RLConfig().validate()
    alg, rollout = cfg.algorithm, cfg.rollout
    assert (alg.name, alg.group_size, alg.clip_ratio, alg.dual_clip, alg.kl_coef) == ("grpo", 8, 0.2, 3.0, 0.0)
    assert (alg.gamma, alg.gae_lambda) == (0.99, 0.95)
    assert (rollout.noise_level, rollout.sde_mode, rollout.num_envs % alg.group_size) == (0.5, "hybrid", 0)
    assert cfg.actor.trainable == "generation"


def test_generation_keys_are_the_sft_recipes() -> None:
    """'generation' trains what the SFT reference trains: the two lists must not drift apart."""
    sft = OmegaConf.to_container(OmegaConf.load(REPO / "examples/sft/config/model/cosmos3.yaml"))
    assert list(GENERATION_TOWER_KEYS) == sft["keys_to_select"]
    assert trainable_keys("generation") == sft["keys_to_select"]
    assert trainable_keys("all") is None
    with pytest.raises(ConfigError) as err:
        trainable_keys("adapters")
    assert err.value.field == "actor.trainable"


REQUIRED = ["rollout.model.model_path=/model", "rollout.model.action_stats_path=/stats.json",
            "rollout.model.action_normalization=quantile_rot"]
"""The fields without a default (``???``): a run names its model and stats; the values checks need them set."""


def _validate(overrides: list[str]) -> RLConfig:
    return load_structured(RLConfig, OmegaConf.from_dotlist(REQUIRED + overrides)).validate()


@pytest.mark.parametrize(("overrides", "field", "words"), [
    (["algorithm.name=reinforce"], "algorithm.name", "unknown algorithm"),
    (["rollout.num_envs=30"], "rollout.num_envs", "groups of algorithm.group_size=8"),
    (["algorithm.group_size=6"], "rollout.num_envs", "groups of algorithm.group_size=6"),
    (["algorithm.group_size=1"], "algorithm.group_size", "no baseline"),
    (["algorithm.group_size=0", "algorithm.name=ppo"], "algorithm.group_size", ">= 1"),
    (["algorithm.clip_ratio=0"], "algorithm.clip_ratio", "(0, 1)"),
    (["algorithm.clip_ratio=1.5"], "algorithm.clip_ratio", "(0, 1)"),
    (["algorithm.dual_clip=0.5"], "algorithm.dual_clip", "> 1"),
    (["algorithm.update_epochs=0"], "algorithm.update_epochs", ">= 1"),
    (["algorithm.minibatch_size=0"], "algorithm.minibatch_size", ">= 1"),
    (["algorithm.kl_coef=-0.1"], "algorithm.kl_coef", ">= 0"),
    (["algorithm.advantage_eps=0"], "algorithm.advantage_eps", "> 0"),
    (["algorithm.gamma=0"], "algorithm.gamma", "(0, 1]"),
    (["algorithm.gamma=1.01"], "algorithm.gamma", "(0, 1]"),
    (["algorithm.gae_lambda=1.5"], "algorithm.gae_lambda", "[0, 1]"),
    (["algorithm.value_clip=0"], "algorithm.value_clip", "> 0"),
    (["algorithm.huber_delta=-1"], "algorithm.huber_delta", "> 0"),
    (["rollout.num_envs=0"], "rollout.num_envs", ">= 1"),
    (["rollout.noise_level=0"], "rollout.noise_level", "no log-prob"),
    (["rollout.sde_mode=sometimes"], "rollout.sde_mode", "unknown mode"),
    (["rollout.sde_mode=every_step"], "rollout.sde_mode", "not implemented"),
    (["rollout.num_denoising_steps=0"], "rollout.num_denoising_steps", ">= 1"),
    (["rollout.executed_steps=0"], "rollout.executed_steps", ">= 1"),
    (["actor.trainable=adapters"], "actor.trainable", "unknown value"),
    (["actor.lr=0"], "actor.lr", "> 0"),
    (["actor.value_lr=-1"], "actor.value_lr", "> 0"),
    (["actor.weight_decay=-0.1"], "actor.weight_decay", ">= 0"),
    (["actor.clip_grad=0"], "actor.clip_grad", "> 0"),
    (["actor.value_hidden_sizes=[64,0]"], "actor.value_hidden_sizes", ">= 1"),
    (["runner.max_iterations=0"], "runner.max_iterations", ">= 1"),
    (["runner.save_interval=0"], "runner.save_interval", ">= 1"),
    (["runner.eval_interval=0"], "runner.eval_interval", ">= 1"),
    (["runner.eval_interval=7"], "runner.eval_interval", "multiple of runner.save_interval=5"),
])
def test_bad_values_name_the_field_and_the_fix(overrides: list[str], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _validate(overrides)
    assert err.value.field == field
    assert words in err.value.problem
    assert err.value.fix, f"{field}: the error names no fix"


def test_the_group_size_fix_names_a_multiple() -> None:
    with pytest.raises(ConfigError) as err:
        _validate(["rollout.num_envs=30"])
    assert "rollout.num_envs=32" in err.value.fix


def test_good_alternatives_pass() -> None:
    cfg = _validate(["algorithm.name=ppo", "algorithm.group_size=1", "rollout.num_envs=7", "env.pipeline_stage_num=1", "algorithm.dual_clip=null",
                     "actor.trainable=all", "runner.eval_interval=null", "algorithm.update_epochs=4"])
    assert cfg.algorithm.dual_clip is None and trainable_keys(cfg.actor.trainable) is None


def test_unknown_key_and_wrong_type_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        _validate(["algorithm.clip_eps=0.2"])
    assert err.value.field == "algorithm.clip_eps" and "clip_ratio" in err.value.problem  # the fields listed
    with pytest.raises(ConfigError) as err:
        _validate(["algorithm.group_size=eight"])
    assert err.value.field == "algorithm.group_size"
