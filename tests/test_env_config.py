"""``env.eval`` config validation and the task prompt (checked against LIBERO itself)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from omegaconf import OmegaConf

from rlinf_cosmos3 import paths
from rlinf_cosmos3.config.base import ConfigError, load_structured
from rlinf_cosmos3.config.env import EnvEvalConfig
from rlinf_cosmos3.config.libero_suites import SUITE_NUM_TASKS
from rlinf_cosmos3.sim.client import simulator_env
from rlinf_cosmos3.workers.env.episodes import eval_episodes
from rlinf_cosmos3.workers.env.prompts import policy_instruction, prompt_from_make_reply, task_language


def test_defaults_follow_the_cosmos_caps_and_all_tasks() -> None:
    caps = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
    for suite, cap in caps.items():
        cfg = EnvEvalConfig(suite=suite).validate()
        assert cfg.resolved_max_episode_steps() == cap
        assert cfg.resolved_task_ids() == list(range(SUITE_NUM_TASKS[suite]))
        assert cfg.num_episodes == SUITE_NUM_TASKS[suite] * 50
    cfg = EnvEvalConfig()
    assert (cfg.num_settle_steps, cfg.image_size, cfg.stop_on_success, cfg.save_video) == (10, 256, True, "none")
    assert EnvEvalConfig(max_episode_steps=32, task_ids=[3], trials_per_task=2).validate().num_episodes == 2


def test_yaml_section_loads_into_the_schema() -> None:
    yaml = OmegaConf.create({"suite": "libero_goal", "task_ids": [0, 2], "trials_per_task": 5,
                             "total_num_envs": 8, "num_workers": 2, "max_episode_steps": 64})
    cfg = load_structured(EnvEvalConfig, yaml, root="env.eval").validate(pipeline_stage_num=2)
    assert cfg.task_ids == [0, 2] and cfg.envs_per_stage(2) == 2 and cfg.resolved_max_episode_steps() == 64
    with pytest.raises(ConfigError, match="env.eval.total_num_env"):
        load_structured(EnvEvalConfig, {"total_num_env": 3}, root="env.eval")


def test_several_suites_each_with_its_own_cap_and_every_episode_once() -> None:
    yaml = OmegaConf.create({"suites": ["libero_spatial", "libero_object", "libero_10"], "task_ids": [0, 9],
                             "init_state_ids": [3, 4], "suite_max_episode_steps": {"libero_10": 600}})
    cfg = load_structured(EnvEvalConfig, yaml, root="env.eval").validate()
    assert cfg.multi_suite and cfg.suite_label == "libero_spatial+libero_object+libero_10"
    assert cfg.step_caps() == {"libero_spatial": 220, "libero_object": 280, "libero_10": 600}
    episodes = eval_episodes(cfg)
    assert len(episodes) == len(set(episodes)) == cfg.num_episodes == 3 * 2 * 2
    assert [(e.suite, e.task_id, e.trial_id) for e in episodes[:5]] == [
        ("libero_spatial", 0, 3), ("libero_spatial", 0, 4), ("libero_spatial", 9, 3), ("libero_spatial", 9, 4),
        ("libero_object", 0, 3)]
    with pytest.raises(ValueError, match="name the suite"):
        cfg.resolved_max_episode_steps()
    # one suite through `suites` is the same run as through `suite`
    one = EnvEvalConfig(suites=["libero_goal"], task_ids=[1], trials_per_task=2).validate()
    assert not one.multi_suite and one.resolved_max_episode_steps() == 300 and one.num_episodes == 2
    assert EnvEvalConfig(suites=["libero_spatial", "libero_90"]).validate().num_episodes == (10 + 90) * 50


@pytest.mark.parametrize(("fields", "field_name", "words"), [
    ({"suites": []}, "env.eval.suites", "is empty"),
    ({"suites": ["libero_spatial", "libero_spatial"]}, "env.eval.suites", "duplicates"),
    ({"suites": ["libero_spatial", "libero_100"]}, "env.eval.suites", "libero_100"),
    ({"suites": ["libero_spatial", "libero_object"], "task_ids": [12]}, "env.eval.task_ids", "libero_spatial"),
    ({"suite_max_episode_steps": {"libero_goal": 300}}, "env.eval.suite_max_episode_steps", "libero_goal"),
    ({"suites": ["libero_spatial", "libero_10"], "suite_max_episode_steps": {"libero_10": 5}},
     "env.eval.suite_max_episode_steps", "libero_10"),
])
def test_bad_suites_are_named_before_any_simulator(fields: dict, field_name: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        EnvEvalConfig(**fields).validate()
    assert field_name in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(("value", "mode"), [
    (True, "all"), (False, "none"), ("all", "all"), ("failures", "failures"), ("None", "none"),
])
def test_save_video_modes_and_the_old_booleans(value: object, mode: str) -> None:
    """YAML/Hydra booleans of older configs keep their meaning (OmegaConf hands them over as "True")."""
    cfg = load_structured(EnvEvalConfig, OmegaConf.create({"save_video": value, "video_dir": "/v"}), root="env.eval")
    assert cfg.validate().save_video == mode
    assert cfg.records_video == (mode != "none")
    assert [cfg.keeps_video(success) for success in (True, False)] == \
        {"all": [True, True], "failures": [False, True], "none": [False, False]}[mode]


def test_divisibility_error_names_every_field() -> None:
    with pytest.raises(ConfigError) as info:
        EnvEvalConfig(total_num_envs=6, num_workers=2).validate(pipeline_stage_num=2)
    message = str(info.value)
    for name in ("env.eval.total_num_envs", "env.eval.num_workers=2", "rollout.pipeline_stage_num=2",
                 "multiple of 4"):
        assert name in message


@pytest.mark.parametrize(("kwargs", "field", "text"), [
    ({"suite": "libero_100"}, "env.eval.suite", "unknown LIBERO suite"),
    ({"task_ids": [0, 10]}, "env.eval.task_ids", "[10] out of range"),
    ({"task_ids": [1, 1]}, "env.eval.task_ids", "duplicates"),
    ({"task_ids": []}, "env.eval.task_ids", "is empty"),
    ({"trials_per_task": 51}, "env.eval.trials_per_task", "1..50"),
    ({"trials_per_task": 0}, "env.eval.trials_per_task", "1..50"),
    ({"total_num_envs": 0}, "env.eval.total_num_envs", ">= 1"),
    ({"num_workers": 0}, "env.eval.num_workers", ">= 1"),
    ({"max_episode_steps": 10}, "env.eval.max_episode_steps", "no policy step"),
    ({"num_settle_steps": -1}, "env.eval.num_settle_steps", ">= 0"),
    ({"save_video": True}, "env.eval.video_dir", "required when save_video"),
    ({"save_video": "failures"}, "env.eval.video_dir", "required when save_video is failures"),
    ({"save_video": "sometimes"}, "env.eval.save_video", "must be one of all, failures, none"),
    ({"sim_timeout_s": 0.0}, "env.eval.sim_timeout_s", "> 0"),
    ({"max_episode_retries": -1}, "env.eval.max_episode_retries", ">= 0"),
])
def test_invalid_values_name_their_field(kwargs: dict, field: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        EnvEvalConfig(**kwargs).validate()
    assert info.value.field == field
    assert text in str(info.value)


GOAL = {"suite": "libero_goal"}


@pytest.mark.parametrize(("kwargs", "text", "fix"), [
    ({"init_states_from_task": {1: 0}}, "only the tasks of ['libero_goal'] share one scene", "env.eval.suite=libero_goal"),
    ({"suites": ["libero_goal", "libero_10"], "init_states_from_task": {1: 0}}, "['libero_goal', 'libero_10']",
     "env.eval.suites=null"),
    ({**GOAL, "init_states_from_task": {1: 10}}, "task ids [10] out of range for libero_goal (10 tasks)", "0..9"),
    ({**GOAL, "init_states_from_task": {-1: 2}}, "task ids [-1] out of range", "0..9"),
    ({**GOAL, "init_states_from_task": {3: 3}}, "maps task(s) [3] to themselves: no swap", "remove those entries"),
    ({**GOAL, "task_ids": [0, 1], "init_states_from_task": {8: 1}}, "swaps task(s) [8], which this run does not "
     "evaluate (env.eval.task_ids=[0, 1])", "add them to env.eval.task_ids"),
])
def test_an_instruction_swap_needs_tasks_of_one_shared_scene(kwargs: dict, text: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        EnvEvalConfig(**kwargs).validate()
    assert info.value.field == "env.eval.init_states_from_task"
    assert text in str(info.value) and fix in (info.value.fix or ""), str(info.value)


@pytest.mark.parametrize("text", [" pick up the bowl", "pick up\nthe bowl"])
def test_an_instruction_override_must_be_the_one_line_that_is_sent(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        EnvEvalConfig(instruction_override=text).validate()
    assert info.value.field == "env.eval.instruction_override" and "surrounding spaces or a line break" in str(info.value)
    assert "instruction_override='pick up the bowl'" in (info.value.fix or "")


def test_swap_and_ablation_options_that_are_valid() -> None:
    cfg = EnvEvalConfig(**GOAL, task_ids=[1, 8], init_states_from_task={8: 1}, instruction_override="").validate()
    assert (cfg.init_state_task(8), cfg.init_state_task(1)) == (1, 1)
    assert EnvEvalConfig(**GOAL, init_states_from_task={8: 1, 3: 1}).validate().init_state_task(3) == 1  # all tasks
    yaml = OmegaConf.create({**GOAL, "init_states_from_task": {8: 1}, "instruction_override": "do something"})
    loaded = load_structured(EnvEvalConfig, yaml, root="env.eval").validate()
    assert loaded.init_states_from_task == {8: 1} and loaded.instruction_override == "do something"
    assert policy_instruction("put the bowl on the plate", None) == "put the bowl on the plate"
    assert policy_instruction("put the bowl on the plate", "") == ""


def test_pipeline_stage_num_is_validated_under_its_own_name() -> None:
    with pytest.raises(ConfigError) as info:
        EnvEvalConfig().validate(pipeline_stage_num=0)
    assert info.value.field == "rollout.pipeline_stage_num"


def test_task_language_follows_libero_rule_on_known_names() -> None:
    assert task_language("pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate") == \
        "pick up the black bowl between the plate and the ramekin and place it on the plate"
    assert task_language("KITCHEN_SCENE3_turn_on_the_stove") == "turn on the stove"
    assert task_language("LIVING_ROOM_SCENE10_put_the_mug_on_the_plate") == "put the mug on the plate"
    # a bridge that reports task.language itself wins over the derivation
    assert prompt_from_make_reply({"language": "x y", "task_name": "a_b"}) == "x y"
    assert prompt_from_make_reply({"task_name": "a_b", "task": "not this"}) == "a b"
    with pytest.raises(ValueError, match="names no SCENE"):
        task_language("Open_the_drawer")


@pytest.mark.libero
def test_task_language_matches_libero_for_every_task_of_every_suite() -> None:
    """The prompt derived from the bridge's task name equals LIBERO's own ``task.language`` (the
    prompt both reference evaluations use) for all 130 tasks; LIBERO runs in its own environment."""
    code = textwrap.dedent("""
        import json
        from libero.libero import benchmark
        suites = benchmark.get_benchmark_dict()
        out = {}
        import sys
        for name in sys.argv[1:]:
            suite = suites[name]()
            out[name] = [[suite.get_task(i).name, suite.get_task(i).language] for i in range(suite.get_num_tasks())]
        print("JSON" + json.dumps(out))
    """)
    proc = subprocess.run([str(paths.libero_python()), "-c", code, *sorted(SUITE_NUM_TASKS)], capture_output=True, text=True, timeout=300,
                          env=simulator_env(), check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("JSON"))
    tasks = json.loads(line[4:])
    assert {k: len(v) for k, v in tasks.items()} == SUITE_NUM_TASKS
    for suite, pairs in tasks.items():
        for name, language in pairs:
            assert task_language(name) == language, (suite, name)


def test_init_state_ids_select_held_out_states() -> None:
    cfg = EnvEvalConfig(task_ids=[0], init_state_ids=list(range(40, 50)), max_episode_steps=32).validate()
    assert cfg.resolved_init_state_ids() == list(range(40, 50)) and cfg.num_episodes == 10
    assert EnvEvalConfig(trials_per_task=3).resolved_init_state_ids() == [0, 1, 2]
    for bad, match in (([], "distinct"), ([3, 3], "distinct"), ([49, 50], "out of range")):
        with pytest.raises(ConfigError, match="env.eval.init_state_ids") as err:
            EnvEvalConfig(init_state_ids=bad).validate()
        assert match in str(err.value)
