"""Bad RL runs are refused before Ray, an actor or a simulator starts: exit code 2 and a log line that names the
field and the fix. Through the launcher once (the shell script and Hydra's command-line check), the rest through
:func:`run_rl` in-process on the composed tiny recipe."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from rlinf_cosmos3.checkpoint.layout import COMPLETE_MARKER, TRAINER_STATE_FILE, actor_dir
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.config.model_settings import RECIPE
from rlinf_cosmos3.config.rl import RLConfig, register_hydra_schema
from rlinf_cosmos3.models.cosmos3.identity import IDENTITY_FILE, ModelIdentity
from rlinf_cosmos3.runners.rl_runner import run_rl
from rlinf_cosmos3.validation.rl import VALUE_HEAD_FILE

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "examples/rl/config"


def _overrides(inputs, tmp_path: Path, *extra: str) -> list[str]:
    return [f"rollout.model.model_path={inputs.model}", f"rollout.model.action_stats_path={inputs.stats}",
            f"runner.logs_dir={tmp_path / 'logs'}", f"runner.log_path={tmp_path / 'ckpts'}", *extra]


def _run(inputs, tmp_path: Path, *extra: str) -> str:
    """run_rl on the tiny recipe; asserts exit code 2 and that nothing started; returns the run log."""
    import ray

    register_hydra_schema()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("libero_rl_cosmos3_tiny", overrides=_overrides(inputs, tmp_path, *extra))
    assert run_rl(cfg, config_name="bad") == 2
    assert not ray.is_initialized()
    (run_dir,) = list((tmp_path / "logs").iterdir())
    log = (run_dir / "rl_embodiment.log").read_text()
    assert "invalid config: config field" in log and "(fix: " in log
    assert "Ray started" not in log and "actor ready" not in log
    return log


@pytest.mark.parametrize(("extra", "field", "words"), [
    (["algorithm.group_size=3"], "rollout.num_envs", "groups of algorithm.group_size=3"),
    (["algorithm.name=reinforce"], "algorithm.name", "unknown algorithm 'reinforce'"),
    (["algorithm.kl_coef=-0.1"], "algorithm.kl_coef", "must be >= 0"),
    (["rollout.num_envs=3", "algorithm.group_size=3", "env.pipeline_stage_num=2"], "rollout.num_envs",
     "env.pipeline_stage_num=2"),
    (["rollout.executed_steps=17"], "rollout.executed_steps", "exceeds the model's chunk of 16"),
    (["cluster.num_cpu_ranks_per_node=2"], "cluster.num_cpu_ranks_per_node", "one rank for now"),
    (["env.init_state_ids=[0,50]"], "env.init_state_ids", "out of range"),
    (["env.python=/nonexistent/python"], "env.python", "simulator interpreter not found"),
    (["runner.max_wall_time_s=0"], "runner.max_wall_time_s", "must be > 0 or null"),
])
def test_bad_values_fail_before_ray(tiny_model_and_stats, tmp_path: Path, extra: list[str], field: str,
                                    words: str) -> None:
    log = _run(tiny_model_and_stats, tmp_path, *extra)
    assert f"config field '{field}'" in log and words in log, log[-2000:]


def _model_with_identity(tiny_model_and_stats, root: Path, **changes: object) -> Path:
    """A copy of the tiny model (components linked) whose model_identity.json says it was trained with ``changes``."""
    model = root / "model"
    model.mkdir()
    for part in Path(tiny_model_and_stats.model).iterdir():
        (model / part.name).symlink_to(part)
    identity = ModelIdentity.of(dataclasses.replace(RECIPE, **changes), tiny_model_and_stats.stats)
    (model / IDENTITY_FILE).write_text(identity.to_json())
    return model


def test_a_model_of_another_identity_fails_before_ray(tiny_model_and_stats, tmp_path: Path) -> None:
    """The model directory says it was trained at 10 fps; the run states 20: refused, naming rollout.model.fps."""
    model = _model_with_identity(tiny_model_and_stats, tmp_path, fps=10)
    log = _run(tiny_model_and_stats, tmp_path, f"rollout.model.model_path={model}")
    assert "config field 'rollout.model.fps'" in log and "fps=10" in log, log[-2000:]


def test_a_model_of_another_stats_file_fails_before_ray(tiny_model_and_stats, tmp_path: Path) -> None:
    """Same settings, but the configured stats file is not the one the model was trained with."""
    model = _model_with_identity(tiny_model_and_stats, tmp_path)
    other = tmp_path / "other_stats.json"
    doc = json.loads(Path(tiny_model_and_stats.stats).read_text())
    doc["metadata"]["note"] = "another file"
    other.write_text(json.dumps(doc))
    log = _run(tiny_model_and_stats, tmp_path, f"rollout.model.model_path={model}",
               f"rollout.model.action_stats_path={other}")
    assert "config field 'rollout.model.action_stats_path'" in log and "sha256" in log, log[-2000:]


def test_resuming_from_an_sft_checkpoint_is_refused(tiny_model_and_stats, tmp_path: Path) -> None:
    """An SFT checkpoint (no RL counters) is not resumed from: the fix says to convert it and start from it."""
    step = tmp_path / "sft" / "global_step_3"
    actor_dir(step).mkdir(parents=True)
    TrainerState(global_step=3).write(actor_dir(step) / TRAINER_STATE_FILE)
    (step / COMPLETE_MARKER).write_text("{}")
    log = _run(tiny_model_and_stats, tmp_path, f"runner.resume_dir={step}")
    assert "config field 'runner.resume_dir'" in log and "not a checkpoint of an RL run" in log
    assert "convert_checkpoint.py" in log


@pytest.mark.parametrize(("written_by", "resumed_as", "words"), [
    ("grpo", "ppo", "has no value head"),
    ("ppo", "grpo", "was written by a PPO run"),
])
def test_resuming_with_another_algorithm_is_refused(tiny_model_and_stats, tmp_path: Path, written_by: str,
                                                    resumed_as: str, words: str) -> None:
    """A resume continues its run: PPO needs the critic its checkpoint holds, GRPO would drop a PPO run's critic."""
    step = tmp_path / "rl" / "global_step_1"
    actor_dir(step).mkdir(parents=True)
    TrainerState(global_step=1, extra={"rl": {"iteration": 1}}).write(actor_dir(step) / TRAINER_STATE_FILE)
    (step / COMPLETE_MARKER).write_text("{}")
    if written_by == "ppo":
        (step / VALUE_HEAD_FILE).write_text("")
    log = _run(tiny_model_and_stats, tmp_path, f"runner.resume_dir={step}", f"algorithm.name={resumed_as}")
    assert "config field 'runner.resume_dir'" in log and words in log, log[-2000:]


def test_launcher_unknown_algorithm_and_unknown_key_exit_2(tiny_model_and_stats, tmp_path: Path) -> None:
    for extra, field in ((["algorithm.name=reinforce"], "algorithm.name"),
                         (["algorithm.clip_eps=0.2"], "algorithm.clip_eps")):
        proc = subprocess.run(["bash", str(REPO / "examples/rl/run_vla_rl.sh"), "libero_rl_cosmos3_tiny",
                               *_overrides(tiny_model_and_stats, tmp_path, *extra)],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out[-3000:]
        assert f"config field '{field}'" in out and "Ray started" not in out
    proc = subprocess.run(["bash", str(REPO / "examples/rl/run_vla_rl.sh"), "no_such_config"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "libero_rl_cosmos3_tiny" in proc.stderr


def test_the_small_recipe_composes_and_its_values_validate() -> None:
    """The one-GPU recipe: every value passes the schema's checks (the model it names is the user's)."""
    from rlinf_cosmos3.config.base import load_structured

    register_hydra_schema()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("libero_rl_cosmos3_small", overrides=["rollout.model.model_path=/m",
                                                            "rollout.model.action_stats_path=/s.json"])
    rl = load_structured(RLConfig, cfg).validate()
    assert (rl.cluster.num_gpus_per_node, rl.rollout.num_envs, rl.algorithm.group_size) == (1, 32, 8)
    assert rl.runner.eval_interval == 5 and rl.env.task_ids == [0]


def test_the_online_eval_judges_the_suite_and_tasks_rl_trains_on(tiny_model_and_stats, tmp_path: Path) -> None:
    """With ``runner.eval_interval`` the eval config (libero_spatial task 0 in the recipes) gets the RL env's suite and
    tasks, unless the user's overrides name them; the eval process's own check accepts the result."""
    from omegaconf import OmegaConf

    from rlinf_cosmos3.config.rl import sft_view
    from rlinf_cosmos3.runners.online_eval import OnlineEvaluator
    from rlinf_cosmos3.validation.rl import load_rl_config
    from rlinf_cosmos3.validation.rollout import served_identity

    def online(*extra: str) -> tuple[RLConfig, list[str]]:
        register_hydra_schema()
        with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
            raw = compose("libero_rl_cosmos3_tiny", overrides=_overrides(
                tiny_model_and_stats, tmp_path, "env.suite=libero_goal", "env.task_ids=[1,4]", "runner.eval_interval=1",
                "runner.online_eval.config_name=libero_spatial_cosmos3_eval_tiny", *extra))
        cfg = load_rl_config(OmegaConf.to_container(raw, resolve=True), check_gpus=False)
        return cfg, sft_view(cfg).runner.online_eval.overrides

    cfg, overrides = online('runner.online_eval.overrides=["env.eval.init_state_ids=[40]"]')
    assert overrides == ["env.eval.suite=libero_goal", "env.eval.task_ids=[1,4]", "env.eval.init_state_ids=[40]"]
    OnlineEvaluator(sft_view(cfg), tmp_path / "run", served_identity(cfg.rollout.model)).check()  # composes, validates
    _, overrides = online('runner.online_eval.overrides=["env.eval.task_ids=[4]"]')
    assert overrides == ["env.eval.suite=libero_goal", "env.eval.task_ids=[4]"]
    _, overrides = online("env.task_ids=null", 'runner.online_eval.overrides=["env.eval.suite=libero_goal"]')
    assert overrides == ["env.eval.task_ids=null", "env.eval.suite=libero_goal"]
