"""Bad inputs to the evaluation entry point, each refused before Ray, a simulator or a server starts.

Real inputs: the tiny Cosmos3 in the genuine diffusers format, real stats files, the real eval YAMLs
composed by Hydra, the driver entry ``run_eval`` in-process, and real sockets and lock files for the
port reservation. After every test nothing may be left running (no Ray, no simulator, no server, no
child process). The table in docs/reliability.md names these tests.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from process_checks import nothing_left_running

from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.config.hydra_cli import compose_overrides
from rlinf_cosmos3.validation.eval import load_eval_config

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "evaluations" / "libero"
TINY = "libero_spatial_cosmos3_eval_tiny"


@pytest.fixture(autouse=True)
def _nothing_left_running():
    with nothing_left_running():
        yield


@pytest.fixture(scope="module")
def inputs(tiny_model_and_stats, tmp_path_factory) -> dict:
    tiny = tiny_model_and_stats
    return {"root": tmp_path_factory.mktemp("bad_eval"), "model": tiny.model, "stats": tiny.stats,
            "stats_doc": tiny.stats_doc}


def _overrides(inputs: dict, *extra: str) -> list[str]:
    return [f"rollout.model.model_path={inputs['model']}", f"rollout.model.action_stats_path={inputs['stats']}",
            f"runner.logs_dir={inputs['root'] / 'logs'}", *extra]


def _raw(inputs: dict, *extra: str) -> dict:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return OmegaConf.to_container(compose(TINY, overrides=_overrides(inputs, *extra)), resolve=True)


def _refused(inputs: dict, field: str, text: str, *extra: str) -> ConfigError:
    with pytest.raises(ConfigError, match=text) as err:
        load_eval_config(_raw(inputs, *extra))
    assert err.value.field == field and err.value.fix, str(err.value)
    return err.value


def _driver_refuses(inputs: dict, tmp_path: Path, field: str, *extra: str) -> str:
    """``run_eval`` exits with 2 before Ray, a simulator or a server; its log names the field and the fix."""
    from rlinf_cosmos3.runners.eval_runner import run_eval

    assert run_eval(_raw(inputs, *extra, f"runner.logs_dir={tmp_path / 'logs'}"), config_name="bad") == 2
    (run_dir,) = (tmp_path / "logs").glob("*-bad")
    log = (run_dir / "eval_embodiment.log").read_text()
    assert f"invalid config: config field '{field}'" in log and "(fix: " in log, log
    assert "evaluating" not in log and "Ray " not in log and not list(run_dir.rglob("*.mp4"))
    return log


def test_the_inputs_are_valid(inputs) -> None:
    cfg = load_eval_config(_raw(inputs))
    assert cfg.env.eval.interpreter.is_file()


# ----------------------------------------------------------------------------- command line keys
@pytest.mark.parametrize(("override", "field", "text", "meant"), [
    ("foo.bar=1", "foo.bar", r"unknown key \(Key 'foo' not in 'EvalConfig'\); the top level has the fields "
                             r"cluster, runner, env, rollout", None),
    ("env.eval.totl_num_envs=4", "env.eval.totl_num_envs", r"'env.eval' has the fields suite", "env.eval.total_num_envs"),
    ("rollout.pipeline_stage_num=two", "rollout.pipeline_stage_num", r"Value 'two' of type 'str'", None),
])
def test_overrides_hydra_rejects_are_config_errors_naming_the_key(inputs, override, field, text, meant) -> None:
    with pytest.raises(ConfigError, match=text) as err:
        compose_overrides(EvalConfig, CONFIG_DIR, TINY, _overrides(inputs, override))
    assert err.value.field == field and err.value.fix
    if meant:
        assert meant in err.value.fix


def test_an_added_unknown_key_is_named(inputs) -> None:
    err = _refused(inputs, "rollout.sglang.batching_max", r"Key 'batching_max' not in 'SGLangConfig'",
                   "+rollout.sglang.batching_max=8")
    assert "rollout.sglang.batching_max_size" in err.fix


# ----------------------------------------------------------------------------- model directory and stats
@pytest.mark.parametrize("part", ["transformer", "vae", "scheduler", "text_tokenizer"])
def test_a_model_directory_without_a_component_is_refused(inputs, tmp_path, part) -> None:
    model = tmp_path / "model"
    shutil.copytree(inputs["model"], model)
    shutil.rmtree(model / part)
    err = _refused(inputs, "rollout.model.model_path", f"has no {part}; it is not a converted diffusers directory",
                   f"rollout.model.model_path={model}")
    assert "checkpoint converter" in err.fix


@pytest.mark.parametrize(("content", "text"), [
    ("{not json", r"unusable stats file: .*not valid JSON"),
    ("wrong_width", r"unusable stats file: .*'global_raw.q99' has 7 values, expected 10"),
    ("normalization", r"computed with normalization=mean_std but the model uses quantile_rot"),
])
def test_an_unusable_stats_file_is_refused(inputs, tmp_path, content, text) -> None:
    doc = json.loads(json.dumps(inputs["stats_doc"]))
    if content == "wrong_width":
        doc["global_raw"]["q99"] = doc["global_raw"]["q99"][:7]
    elif content == "normalization":
        doc["metadata"]["normalization"] = "mean_std"
    path = tmp_path / "stats.json"
    path.write_text(content if content.startswith("{") else json.dumps(doc))
    _refused(inputs, "rollout.model.action_stats_path", text, f"rollout.model.action_stats_path={path}")


def test_stats_computed_at_another_fps_are_refused(inputs, tmp_path) -> None:
    doc = json.loads(json.dumps(inputs["stats_doc"]))
    doc["metadata"]["fps"] = 10
    path = tmp_path / "stats10.json"
    path.write_text(json.dumps(doc))
    err = _refused(inputs, "rollout.model.action_stats_path", r"computed with fps=10 but the model uses 20",
                   f"rollout.model.action_stats_path={path}")
    assert "stats file the model was trained with" in err.fix
    _driver_refuses(inputs, tmp_path, "rollout.model.action_stats_path", f"rollout.model.action_stats_path={path}")


def test_a_converted_model_of_another_training_is_refused_before_ray(inputs, tmp_path) -> None:
    """A model directory whose identity.json (written by the converter) records fps=10, served at 20."""
    import dataclasses

    from rlinf_cosmos3.models.cosmos3.identity import write_identity
    from rlinf_cosmos3.validation.rollout import served_identity

    model = tmp_path / "model_fps10"
    shutil.copytree(inputs["model"], model)
    served = served_identity(load_eval_config(_raw(inputs)).rollout.model)
    write_identity(model, dataclasses.replace(served, fps=10))
    err = _refused(inputs, "rollout.model.fps", r"rollout.model.fps=20 but the model was trained with fps=10",
                   f"rollout.model.model_path={model}")
    assert "set rollout.model.fps=10" in err.fix
    _driver_refuses(inputs, tmp_path, "rollout.model.fps", f"rollout.model.model_path={model}")


@pytest.mark.parametrize(("overrides", "text", "fix"), [
    (["env.eval.total_num_envs=6", "env.eval.num_workers=2", "rollout.pipeline_stage_num=2"],
     r"6 envs cannot be split evenly over env.eval.num_workers=2 x rollout.pipeline_stage_num=2", "a multiple of 4"),
    (["env.eval.total_num_envs=3", "env.eval.num_workers=1", "rollout.pipeline_stage_num=2"],
     r"3 envs cannot be split evenly over env.eval.num_workers=1 x rollout.pipeline_stage_num=2", "a multiple of 2"),
])
def test_envs_that_do_not_divide_into_workers_and_stages_are_refused(inputs, tmp_path, overrides, text, fix) -> None:
    err = _refused(inputs, "env.eval.total_num_envs", text, *overrides)
    assert fix in err.fix
    _driver_refuses(inputs, tmp_path, "env.eval.total_num_envs", *overrides)



def test_a_save_video_mode_that_does_not_exist_is_refused_before_ray(inputs, tmp_path) -> None:
    err = _refused(inputs, "env.eval.save_video", "must be one of all, failures, none", "env.eval.save_video=fails")
    assert "'fails'" in str(err) and "env.eval.save_video=failures" in err.fix
    _driver_refuses(inputs, tmp_path, "env.eval.save_video", "env.eval.save_video=fails")
    for old, mode in (("true", "all"), ("false", "none"), ("failures", "failures")):  # the old booleans still work
        assert load_eval_config(_raw(inputs, f"env.eval.save_video={old}")).env.eval.save_video == mode


def test_a_video_rate_that_does_not_divide_the_control_rate_is_refused(inputs, tmp_path) -> None:
    err = _refused(inputs, "env.eval.video_fps", "must divide the control rate 20", "env.eval.video_fps=3")
    assert "20, 10, 5, 4, 2, 1" in err.fix
    _driver_refuses(inputs, tmp_path, "env.eval.video_fps", "env.eval.video_fps=3")
    for fps, stride in ((20, 1), (10, 2), (5, 4)):  # the videos play in real time: every stride-th step rendered
        assert load_eval_config(_raw(inputs, f"env.eval.video_fps={fps}")).env.eval.video_frame_stride == stride


def test_an_experiment_name_that_is_not_one_directory_is_refused(inputs, tmp_path) -> None:
    err = _refused(inputs, "runner.experiment_name", "'a/b' is not a plain directory name", "runner.experiment_name=a/b")
    assert "without '/'" in err.fix
    _driver_refuses(inputs, tmp_path, "runner.experiment_name", "runner.experiment_name=a/b")  # logged in *-bad


def test_the_experiment_name_names_the_run_directory(inputs, tmp_path) -> None:
    from rlinf_cosmos3.runners.eval_runner import run_eval

    logs = tmp_path / "logs"
    assert run_eval(_raw(inputs, "runner.experiment_name=my_ablation", "env.eval.save_video=fails",
                         f"runner.logs_dir={logs}"), config_name=TINY) == 2
    (run_dir,) = logs.iterdir()
    assert run_dir.name.endswith("-my_ablation"), run_dir
    assert "config field 'env.eval.save_video'" in (run_dir / "eval_embodiment.log").read_text()
    assert run_eval(_raw(inputs, "env.eval.save_video=fails", f"runner.logs_dir={logs}"), config_name=TINY) == 2
    assert {p.name.split("-", 2)[-1] for p in logs.iterdir()} == {"my_ablation", TINY}  # unset: the config's name


@pytest.mark.parametrize(("value", "text"), [(0, "must be >= 1, got 0"),
                                             (17, "17 but a request returns 16 commands")])
def test_open_loop_steps_outside_the_chunk_are_refused(inputs, tmp_path, value, text) -> None:
    _refused(inputs, "env.eval.open_loop_steps", text, f"env.eval.open_loop_steps={value}")
    _driver_refuses(inputs, tmp_path, "env.eval.open_loop_steps", f"env.eval.open_loop_steps={value}")
    assert load_eval_config(_raw(inputs, "env.eval.open_loop_steps=8")).env.eval.open_loop_steps == 8


def test_an_instruction_swap_outside_one_shared_scene_is_refused_before_ray(inputs, tmp_path) -> None:
    """The tiny config evaluates libero_spatial task 0: a swap there, or of a task it does not evaluate, is refused."""
    err = _refused(inputs, "env.eval.init_states_from_task", "share one scene", "++env.eval.init_states_from_task={0:1}")
    assert "env.eval.suite=libero_goal" in err.fix
    _refused(inputs, "env.eval.init_states_from_task", r"swaps task\(s\) \[8\], which this run does not evaluate",
             "env.eval.suite=libero_goal", "++env.eval.init_states_from_task={8:1}")
    _driver_refuses(inputs, tmp_path, "env.eval.init_states_from_task", "++env.eval.init_states_from_task={0:1}")
    ok = load_eval_config(_raw(inputs, "env.eval.suite=libero_goal", "env.eval.task_ids=[1,8]",
                               "++env.eval.init_states_from_task={8:1}", "env.eval.instruction_override=''"))
    assert ok.env.eval.init_states_from_task == {8: 1} and ok.env.eval.instruction_override == ""
    # without ++ Hydra cannot set a dict field: the error says how
    with pytest.raises(ConfigError, match="Hydra cannot set the dict field") as plain:
        compose_overrides(EvalConfig, CONFIG_DIR, TINY, _overrides(inputs, "env.eval.init_states_from_task={8:1}"))
    assert plain.value.field == "env.eval.init_states_from_task"
    assert plain.value.fix == "write '++env.eval.init_states_from_task={8:1}' (++: set or add)"


def test_an_instruction_override_with_surrounding_spaces_is_refused(inputs, tmp_path) -> None:
    err = _refused(inputs, "env.eval.instruction_override", "surrounding spaces or a line break",
                   "env.eval.instruction_override=' pick up the bowl '")
    assert "'pick up the bowl'" in err.fix
    _driver_refuses(inputs, tmp_path, "env.eval.instruction_override", "env.eval.instruction_override=' x'")


# ----------------------------------------------------------------------------- environments
def test_a_missing_simulator_environment_is_refused_before_ray(inputs, tmp_path, monkeypatch) -> None:
    err = _refused(inputs, "env.eval.python", r"simulator interpreter not found at '/no/libero/bin/python'",
                   "env.eval.python=/no/libero/bin/python")
    assert "requirements/install.sh" in err.fix
    monkeypatch.setenv("RLINF_COSMOS3_LIBERO_PYTHON", str(tmp_path / "missing" / "python"))
    _refused(inputs, "env.eval.python", str(tmp_path / "missing" / "python"))
    _driver_refuses(inputs, tmp_path, "env.eval.python")


def test_a_missing_sglang_environment_is_refused(inputs, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLINF_COSMOS3_SGLANG_PYTHON", str(tmp_path / "python"))
    err = _refused(inputs, "rollout.sglang.python", "SGLang interpreter not found")
    assert "requirements/install.sh" in err.fix
    _driver_refuses(inputs, tmp_path, "rollout.sglang.python")
    load_eval_config(_raw(inputs, "rollout.rollout_backend=embedded"))  # the embedded backend does not need it


def test_gpus_asked_for_but_absent(inputs) -> None:
    import torch

    if torch.cuda.device_count():
        pytest.skip("this machine has GPUs")
    _refused(inputs, "rollout.sglang.num_servers", "needs 1 GPUs but this machine has 0",
             "rollout.sglang.gpus_per_server=1")
    _refused(inputs, "rollout.embedded.num_workers", "needs 1 GPUs but this machine has 0",
             "rollout.rollout_backend=embedded", "rollout.embedded.gpus_per_worker=1")


@pytest.mark.parametrize(("urls", "text"), [
    ("[]", "is empty"),
    ("[localhost:30000]", "not http://host:port URLs"),
    ("[http://127.0.0.1]", "not http://host:port URLs"),
    ("['http://127.0.0.1:30000/v1/actions']", "not http://host:port URLs"),
    ("[http://127.0.0.1:30000,'http://127.0.0.1:30000/']", "duplicates"),
])
def test_bad_server_urls_are_refused_before_anything_starts(inputs, urls, text) -> None:
    _refused(inputs, "rollout.sglang.server_urls", text, f"rollout.sglang.server_urls={urls}")


def test_attaching_to_running_servers_needs_neither_gpus_nor_an_sglang_environment(inputs, tmp_path,
                                                                                   monkeypatch) -> None:
    monkeypatch.setenv("RLINF_COSMOS3_SGLANG_PYTHON", str(tmp_path / "python"))
    cfg = load_eval_config(_raw(inputs, "rollout.sglang.server_urls=[http://10.0.0.5:30000,http://10.0.0.6:30000]",
                                "rollout.sglang.gpus_per_server=1", "rollout.sglang.num_servers=8"))
    assert cfg.rollout.sglang.attaches and cfg.rollout.sglang.server_urls == ["http://10.0.0.5:30000",
                                                                              "http://10.0.0.6:30000"]


# ----------------------------------------------------------------------------- ports
@pytest.mark.parametrize("port", [80, 65500])
def test_a_base_port_outside_the_user_range_is_refused(inputs, port) -> None:
    err = _refused(inputs, "rollout.sglang.base_port", rf"must be in \[1024, 65000\], got {port}",
                   f"rollout.sglang.base_port={port}")
    assert "base_port" in err.fix


def test_a_port_in_use_moves_the_server_block_past_it(tmp_path, monkeypatch) -> None:
    """A server's block of 4 ports skips a port another program listens on and one another process
    has reserved (its lock file), instead of colliding or failing."""
    from rlinf_cosmos3.workers.rollout import ports

    monkeypatch.setenv(ports.LOCK_DIR_ENV, str(tmp_path / "locks"))
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        if busy + 12 > ports.MAX_PORT:
            pytest.skip("the kernel gave a port too close to the top")
        block = ports.reserve_port_block(busy - 1)  # the listener sits inside the first candidate block
        assert busy not in block.ports and block.http > busy
        assert all(ports.port_is_free(p) for p in block.ports)
        # Another process reserves the next block (flock on the lock file, as another eval run's servers do).
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, os, sys, time\n"
             f"fd = os.open({str(ports.lock_dir() / 'port-')!r} + sys.argv[1] + '.lock', os.O_CREAT | os.O_RDWR)\n"
             "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(block.http + 4)],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            other = ports.reserve_port_block(block.http + 4)
            assert block.http + 4 not in other.ports and not set(other.ports) & set(block.ports)
        finally:
            holder.kill()
            holder.wait()
        block.release()
        other.release()
