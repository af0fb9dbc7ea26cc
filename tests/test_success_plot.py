"""success.png and the per-task intervals of summary.json, from the eval's own EpisodeResult rows."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from rlinf_cosmos3.runners.eval_runner import _task_entry, write_success_plot
from rlinf_cosmos3.tracking.success import wilson_interval
from rlinf_cosmos3.workers.env.results import EpisodeResult

TASK = "pick up the black bowl between the plate and the ramekin and place it on the plate"


def _results(task: int, successes: int, trials: int, errored: int = 0) -> list[EpisodeResult]:
    return [EpisodeResult(suite="libero_spatial", task_id=task, trial_id=i, success_once=i < successes or i >= trials - errored,
                          success_at_end=i < successes - 1, steps=100, task_description=TASK,
                          error="crashed" if i >= trials - errored else None) for i in range(trials)]


def test_summary_entry_counts_errors_as_failures_with_wilson_intervals() -> None:
    rows = _results(0, 7, 10, errored=2)  # 7 real successes + 2 errored episodes flagged success_once
    entry = _task_entry(rows)
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
