"""success.png and the per-task intervals of summary.json, from the eval's own EpisodeResult rows."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from rlinf_cosmos3.runners.eval_summary import rates_entry, write_success_plot
from rlinf_cosmos3.tracking.success import wilson_interval
from rlinf_cosmos3.workers.env.results import EpisodeResult

TASK = "pick up the black bowl between the plate and the ramekin and place it on the plate"


def _results(task: int, successes: int, trials: int, errored: int = 0) -> list[EpisodeResult]:
    return [EpisodeResult(suite="libero_spatial", task_id=task, trial_id=i, success_once=i < successes or i >= trials - errored,
                          success_at_end=i < successes - 1, steps=100, task_description=TASK,
                          error="crashed" if i >= trials - errored else None) for i in range(trials)]


def test_summary_entry_counts_errors_as_failures_with_wilson_intervals() -> None:
    rows = _results(0, 7, 10, errored=2)  # 7 real successes + 2 errored episodes flagged success_once
    entry = rates_entry(rows)
    assert entry["num_trajectories"] == 10 and entry["success_once"] == 0.7 and entry["success_at_end"] == 0.6
    assert entry["success_once_ci95"] == list(wilson_interval(7, 10))
    assert entry["success_at_end_ci95"] == list(wilson_interval(6, 10))


def test_success_png_has_a_bar_per_task_and_survives_a_bad_path(tmp_path: Path, caplog) -> None:
    rows = _results(0, 9, 10) + _results(1, 2, 10) + _results(2, 0, 5)
    path = write_success_plot(rows, tmp_path / "success.png", "libero_spatial: success_once")
    with Image.open(path) as img:
        width, height = img.size
    few = write_success_plot(_results(0, 1, 2), tmp_path / "one.png", "one task")
    with Image.open(few) as img:
        assert img.size[0] == width and img.size[1] < height  # one row per task (+ all): taller with more tasks
    assert write_success_plot(rows, tmp_path / "missing" / "dir" / "success.png", "x") is None
    assert "could not draw" in caplog.text and "summary.json" in caplog.text


def test_success_png_draws_a_task_that_always_or_never_succeeds(tmp_path: Path) -> None:
    # 10/10: the Wilson upper bound is 1 - 1.1e-16, below the rate by rounding (a run on the GPU lost its picture)
    assert wilson_interval(10, 10)[1] < 1.0
    rows = _results(0, 10, 10) + _results(1, 0, 10)
    path = write_success_plot(rows, tmp_path / "success.png", "all or nothing")
    assert path is not None and path.is_file()


def test_a_two_suite_summary_has_per_task_per_suite_and_overall_rates_with_their_caps(tmp_path: Path) -> None:
    from rlinf_cosmos3.config.eval import EvalConfig
    from rlinf_cosmos3.runners.eval_summary import summarize, write_summary

    cfg = EvalConfig()
    cfg.env.eval.suites, cfg.env.eval.task_ids = ["libero_spatial", "libero_object"], [0, 1]
    spatial = _results(0, 9, 10) + _results(1, 2, 10)
    obj = [EpisodeResult(**{**r.to_dict(), "suite": "libero_object", "task_description": "pick up the soup"})
           for r in _results(1, 5, 5)]
    summary = summarize(spatial + obj, cfg, wall_time_s=10.0, chunk_requests=3, run_dir=tmp_path)
    out = summary.to_dict()
    assert out["suite"] == "libero_spatial+libero_object" and out["suites"] == ["libero_spatial", "libero_object"]
    assert out["step_cap"] == {"libero_spatial": 220, "libero_object": 280}
    assert set(out["per_task"]) == {"libero_spatial/0", "libero_spatial/1", "libero_object/1"}
    assert out["per_task"]["libero_object/1"]["success_once"] == 1.0
    assert out["per_suite"]["libero_spatial"]["success_once"] == 11 / 20
    assert out["per_suite"]["libero_spatial"]["success_once_ci95"] == list(wilson_interval(11, 20))
    assert out["per_suite"]["libero_object"]["step_cap"] == 280
    assert set(out["per_suite"]["libero_spatial"]["per_task"]) == {"0", "1"}
    assert out["num_trajectories"] == 25 and out["success_once"] == 16 / 25
    assert out["success_once_ci95"] == list(wilson_interval(16, 25))

    write_summary(summary, spatial + obj, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["per_suite"]["libero_object"]["num_trajectories"] == 5
    assert (tmp_path / "success.png").is_file()


def test_the_printed_table_has_a_line_per_task_per_suite_and_overall() -> None:
    from rlinf_cosmos3.tracking.success_table import success_table

    rows = [r.to_dict() for r in _results(0, 9, 10) + _results(1, 2, 10, errored=1)]
    rows += [{**r.to_dict(), "suite": "libero_10", "task_description": "turn on the stove"} for r in _results(4, 1, 4)]
    lines = success_table(rows, {"libero_spatial": 220, "libero_10": 520}).splitlines()
    assert lines[0].split() == ["suite", "task", "success_once", "success_at_end"]
    body = [line.split("  ")[0:2] for line in lines[2:]]
    assert [b[0].strip() for b in body] == ["libero_spatial"] * 3 + ["libero_10"] * 2 + ["all suites"]
    assert "all (cap 220 steps)" in lines[4] and "all (cap 520 steps)" in lines[6]
    assert lines[2].split("  ")[1].startswith("0 pick up the black bowl") and lines[2].split("  ")[1].endswith("...")
    assert "90.0%" in lines[2] and "(9/10)" in lines[2]
    assert "(2/10)" in lines[3]  # the errored episode is a failure although flagged success_once
    assert "(11/20)" in lines[4] and "(1/4)" in lines[6] and "(12/24)" in lines[7]
    one_suite = success_table(rows[:10], {"libero_spatial": 220}).splitlines()
    assert len(one_suite) == 4 and "all suites" not in one_suite[-1]
