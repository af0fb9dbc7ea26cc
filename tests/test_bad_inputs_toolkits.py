"""Bad inputs to the toolkits: each exits with code 2 and one line naming the input and the fix, no traceback,
before a simulator starts or anything is written.

The command lines run in-process (``main(argv)``) on real inputs: LeRobot v3 datasets written by
lerobot, the tiny Cosmos3 directory, real stats files, real TensorBoard event files and eval results
files. After every test nothing may be left running (no simulator, no child process). The table in
docs/reliability.md names these tests.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import write_libero_like
from process_checks import nothing_left_running

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _nothing_left_running():
    with nothing_left_running():
        yield


def _cli(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem + "_cli", REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def inputs(tiny_model_and_stats, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad_toolkits")
    return {"root": root, "model": tiny_model_and_stats.model, "stats": tiny_model_and_stats.stats,
            # lerobot's writer; its random actions keep the gripper in [-0.5, 0.5], not the stored [0, 1]
            "data": write_libero_like(root / "data", length=20),
            "no_action": write_libero_like(root / "no_action", action_dim=None),
            "action6": write_libero_like(root / "action6", action_dim=6)}


# ----------------------------------------------------------------------------- record_demos
def _record(argv: list[str]) -> int | None:
    """record_demos' command line in-process; its exit code (argparse's SystemExit or main's return)."""
    try:
        return _cli("toolkits/libero/record_demos.py").main(["--suite", "libero_spatial", "--no-progress", *argv])
    except SystemExit as exit_:
        return exit_.code


@pytest.mark.parametrize(("argv", "text"), [
    (["--task-ids", "12"], r"--task-ids: \[12\] out of range for libero_spatial \(10 tasks\) \(fix: use ids in 0\.\.9\)"),
    (["--task-ids", "5-2"], r"--task-ids: empty range '5-2'"),
    (["--task-ids", "0", "--init-states", "48-51"],
     r"--init-states: \[50, 51\] out of range .* \(fix: use ids in 0\.\.49\)"),
    (["--task-ids", "0", "--init-states", "60"], r"--init-states: a count must be in 1\.\.50"),
    (["--task-ids", "0", "--num-envs", "0"], r"--num-envs: must be >= 1, got 0 \(fix: "),
    (["--task-ids", "0", "--max-steps", "0"], r"--max-steps: must be >= 1, got 0 \(fix: "),
    (["--task-ids", "0", "--settle-steps", "-1"], r"--settle-steps: must be >= 0, got -1 \(fix: "),
    (["--task-ids", "0", "--action-noise", "-0.1"], r"--action-noise: must be >= 0, got -0.1 \(fix: "),
    (["--task-ids", "0", "--recorded-action", "noisy"], r"--recorded-action: invalid choice: 'noisy'"),
    (["--task-ids", "0", "--noise-period", "0"], r"--noise-period: must be >= 1, got 0 \(fix: "),
    (["--task-ids", "0", "--noise-period", "8", "--noise-burst", "9"],
     r"--noise-burst: must be in 1\.\.noise_period \(8\), got 9 \(fix: "),
    (["--task-ids", "0", "--place-jitter", "-0.01"], r"--place-jitter: must be >= 0, got -0.01 \(fix: "),
    (["--task-ids", "0", "--approach-jitter", "-0.01"], r"--approach-jitter: must be >= 0, got -0.01 \(fix: "),
    (["--task-ids", "0", "--repeats", "0"], r"--repeats: must be >= 1, got 0 \(fix: "),
    (["--task-ids", "0", "--repeats", "3"],
     r"--repeats: 3 episodes per init state would be identical: the scripted policy draws nothing \(fix: add"),
], ids=["task_out_of_range", "empty_range", "init_state_out_of_range", "count_too_large", "no_envs", "no_steps",
        "negative_settle", "negative_noise", "unknown_recorded_action", "no_noise_period", "burst_over_period",
        "negative_place_jitter", "negative_approach_jitter", "no_repeats", "identical_repeats"])
def test_record_demos_rejects_bad_arguments_before_any_simulator(tmp_path, capsys, argv, text) -> None:
    assert _record([*argv, "--out", str(tmp_path / "d")]) == 2
    assert re.search(text, capsys.readouterr().err)
    assert not (tmp_path / "d").exists()


def test_record_demos_without_the_simulator_environment_writes_nothing(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RLINF_COSMOS3_LIBERO_PYTHON", str(tmp_path / "no_env" / "python"))
    assert _record(["--task-ids", "0", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"RLINF_COSMOS3_LIBERO_PYTHON: simulator interpreter {tmp_path / 'no_env' / 'python'} not found" in err
    assert "(fix: run requirements/install.sh" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()  # a later run, once installed, is not refused for a non-empty --out


def test_record_demos_refuses_a_non_empty_out_before_any_simulator(tmp_path, capsys) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("results of another run")
    assert _record(["--task-ids", "0", "--out", str(tmp_path / "d")]) == 2
    assert "--out: '" + str(tmp_path / "d") + "' exists and is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["keep.txt"]


# ----------------------------------------------------------------------------- compute_action_stats
@pytest.mark.parametrize(("data", "extra", "text"), [
    ("no_action", [], r"--data: .*dataset has no 'action' feature"),
    ("action6", [], r"--data: .*'action' has shape \(6,\), expected \(7,\)"),
    ("data", [], r"--data: episode 0: gripper channel spans .* outside \[0, 1\]"),
    ("data", ["--episodes", "3"], r"--episodes \[3\] are not in the dataset \(1 episodes\) \(fix: choose among .* 0\.\.0\)"),
    ("not_a_dataset", [], r"--data: not a LeRobot dataset \(no meta/info.json\)"),
], ids=["no_action_column", "six_d_action", "gripper_convention", "missing_episode", "not_a_dataset"])
def test_compute_action_stats_rejects_data_it_cannot_use(inputs, tmp_path, caplog, data, extra, text) -> None:
    path = inputs[data] if data in inputs else tmp_path
    with caplog.at_level(logging.ERROR, logger="compute_action_stats"):
        code = _cli("toolkits/cosmos3/compute_action_stats.py").main(
            ["--data", str(path), "--out", str(tmp_path / "stats.json"), *extra])
    assert code == 2
    assert re.search(text, caplog.text) and "(fix: " in caplog.text, caplog.text
    assert not (tmp_path / "stats.json").exists()


def test_compute_action_stats_checks_its_numbers_before_reading(inputs, tmp_path, capsys) -> None:
    for flag in ("--chunk-length", "--max-samples"):
        with pytest.raises(SystemExit) as exit_:
            _cli("toolkits/cosmos3/compute_action_stats.py").main(
                ["--data", str(inputs["data"]), "--out", str(tmp_path / "stats.json"), flag, "0"])
        assert exit_.value.code == 2
        assert f"{flag}: must be >= 1, got 0 (fix: " in capsys.readouterr().err
    assert not (tmp_path / "stats.json").exists()


# ----------------------------------------------------------------------------- make_tiny_model
@pytest.mark.parametrize(("argv", "text"), [
    (["--num-layers", "0"], "--num-layers: num_layers must be in 1..2 for the tiny preset, got 0"),
    (["--materialize-on", "cpu"], "--materialize-on is for presets without CPU weights"),
])
def test_make_tiny_model_rejects_bad_arguments(tmp_path, capsys, argv, text) -> None:
    with pytest.raises(SystemExit) as exit_:
        _cli("toolkits/cosmos3/make_tiny_model.py").main(["--out", str(tmp_path / "m"), *argv])
    assert exit_.value.code == 2 and text in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_make_tiny_model_keeps_an_existing_directory(inputs, capsys) -> None:
    before = sorted(p.name for p in inputs["model"].rglob("*"))
    with pytest.raises(SystemExit) as exit_:
        _cli("toolkits/cosmos3/make_tiny_model.py").main(["--out", str(inputs["model"])])
    assert exit_.value.code == 2 and "--out: " in (err := capsys.readouterr().err)
    assert "exists; pass overwrite=True (--overwrite)" in err
    assert sorted(p.name for p in inputs["model"].rglob("*")) == before


# ----------------------------------------------------------------------------- success_report, plot_training
def _results(run: Path, *lines: str) -> Path:
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


def test_success_report_rejects_what_is_not_an_eval_run(tmp_path, capsys) -> None:
    good = json.dumps({"suite": "libero_spatial", "task_id": 0, "trial_id": 1, "success_once": True,
                       "success_at_end": True, "steps": 40, "error": None})
    cases = [
        (str(tmp_path / "nowhere"), "no results.jsonl in eval run"),
        (str(_results(tmp_path / "cut", good, '{"task_id": 0, "tri')), "results.jsonl:2 is not a JSON line"),
        (str(_results(tmp_path / "other", good, json.dumps({"task_id": 0, "success": 1}))),
         "results.jsonl:2 lacks ['trial_id', 'success_once', 'success_at_end']"),
        (f"{_results(tmp_path / 'good', good)}:x-y", "init states must be ids or ranges such as 0-39"),
    ]
    report = _cli("toolkits/eval/success_report.py")
    for spec, text in cases:
        assert report.main(["--group", "g", spec, "--out", str(tmp_path / "r.json")]) == 2
        err = capsys.readouterr().err
        assert text in err and ("give the run directory" in err or "such as 0-39" in err), err
    assert not (tmp_path / "r.json").exists()
    assert report.main(["--group", "g", str(tmp_path / "good")]) == 0  # the same file, well formed


def test_plot_training_rejects_what_is_not_an_sft_run(tmp_path, capsys) -> None:
    from rlinf_cosmos3.tracking import ScalarWriter

    with ScalarWriter(tmp_path / "eval_run" / "tensorboard", prefix="eval") as writer:  # an eval run's events
        writer.log({"success_once": 1.0}, step=1)
    plot = _cli("toolkits/plot_training.py")
    for run, text in ((tmp_path / "nowhere", "no run directory"), (tmp_path / "eval_run", "no train/loss scalars")):
        assert plot.main([str(run)]) == 2
        err = capsys.readouterr().err
        assert text in err and "the logs/<timestamp>-<config> directory the SFT launcher printed" in err, err
    assert not list(tmp_path.rglob("*.png"))


def test_plot_training_joins_a_run_and_its_resumption(tmp_path) -> None:
    from rlinf_cosmos3.tracking import ScalarWriter

    for name, steps in (("first", range(1, 4)), ("resumed", range(3, 6))):
        with ScalarWriter(tmp_path / name / "tensorboard", prefix="train") as writer:
            for step in steps:
                writer.log({"loss": 10.0 * step + (0.5 if name == "resumed" else 0.0), "lr": 1e-4}, step=step)
    plot = _cli("toolkits/plot_training.py")
    steps, values = plot.joined_scalars([tmp_path / "first", tmp_path / "resumed"])["train/loss"]
    assert steps == [1, 2, 3, 4, 5] and values == [10.0, 20.0, 30.5, 40.5, 50.5]  # the resumed run wins at step 3
    assert plot.main([str(tmp_path / "first"), str(tmp_path / "resumed"), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- open_loop_error
def test_open_loop_error_checks_the_model_like_evaluation(inputs, tmp_path, capsys) -> None:
    import dataclasses

    from rlinf_cosmos3.models.cosmos3.identity import ModelIdentity, file_sha256, write_identity

    incomplete = tmp_path / "incomplete"
    shutil.copytree(inputs["model"], incomplete, ignore=shutil.ignore_patterns("transformer"))
    other = tmp_path / "other_training"  # trained with another stats file
    shutil.copytree(inputs["model"], other)
    identity = ModelIdentity(fps=20, action_horizon=16, num_frames=17, canvas_height=192, canvas_width=320,
                             view_point="concat_view", normalization="quantile_rot",
                             stats_sha256=file_sha256(inputs["stats"]), domain_name="libero")
    write_identity(other, dataclasses.replace(identity, stats_sha256="0" * 64))
    wide = tmp_path / "stats7.json"
    doc = json.loads(inputs["stats"].read_text())
    doc["global_raw"]["q01"] = doc["global_raw"]["q01"][:7]
    wide.write_text(json.dumps(doc))
    cases = [
        (tmp_path / "nowhere", inputs["stats"], ["0"], "--model: Cosmos3 diffusers model not found"),
        (incomplete, inputs["stats"], ["0"], "--model: '" + str(incomplete) + "' has no transformer"),
        (inputs["model"], wide, ["0"], "--stats: unusable stats file"),
        (other, inputs["stats"], ["0"], "--stats: the model in"),
        (inputs["model"], inputs["stats"], ["3"], "--episodes: data.episodes [3] do not exist"),
    ]
    tool = _cli("toolkits/eval/open_loop_error.py")
    for model, stats, episodes, text in cases:
        code = tool.main(["--model", str(model), "--stats", str(stats), "--data", str(inputs["data"]),
                          "--episodes", *episodes, "--steps", "1", "--out", str(tmp_path / "err.json")])
        err = capsys.readouterr().err
        assert code == 2 and text in err and "(fix: " in err, err
    assert not (tmp_path / "err.json").exists()


def test_open_loop_error_picks_frames_over_the_whole_episode(inputs, tmp_path, capsys) -> None:
    """The good path: frames spread over the whole 20-frame episode, the padded tail included (with the
    recipe's complete chunks only, frames 4..19 would not exist), each scored against its recorded chunk."""
    out = tmp_path / "err.json"
    code = _cli("toolkits/eval/open_loop_error.py").main([
        "--model", str(inputs["model"]), "--stats", str(inputs["stats"]), "--data", str(inputs["data"]),
        "--episodes", "0", "--frames-per-episode", "3", "--steps", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "constant_mean_action" in printed and "(3 frames)" in printed, printed
    report = json.loads(out.read_text())
    assert [row["frame"] for row in report["per_frame"]] == [0, 10, 19]
    for errors in (report["policy"], report["constant_mean_action"], *report["per_frame"]):
        assert np.isfinite(errors["dpos_mae"]) and 0.0 <= errors["gripper_agreement"] <= 1.0
