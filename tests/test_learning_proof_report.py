"""``benchmarks/gpu/learning_proof.sh``'s report phase when an eval it names is missing.

With ``LP_EXTRA_SEEDS="43 44"`` and no seed-44 eval (a call that ran out of time, or seed 44 evaluated
by hand later), the phase once died without a word: ``ls`` of the missing logs directory failed inside
a ``$(...)`` under ``set -euo pipefail``, so no report was written at all. Now it reports the evals that
exist and says which seed it left out. Results rows as the eval writes them (``results.jsonl``); the
script run as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _eval_run(logs: Path, name: str, failed: set[int], tasks: dict[int, set[int]] | None = None) -> Path:
    """``logs/<name>/<timestamp>-<config>/results.jsonl``: init states 0-49 of task 0, ``failed`` failing
    (or of each task of ``tasks``, its own init states failing)."""
    run = logs / name / "20261204-160034-libero_spatial_cosmos3_eval_small"
    run.mkdir(parents=True)
    rows = [{"suite": "libero_spatial", "task_id": task, "trial_id": trial, "success_once": trial not in fails,
             "success_at_end": trial not in fails, "steps": 220 if trial in fails else 75, "error": None,
             "slot_id": trial % 16, "attempts": 1, "video": None,
             "object_lift_m": {"akita_black_bowl_1": 0.0 if trial in fails else 0.06}}
            for task, fails in (tasks or {0: failed}).items() for trial in range(50)]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _report(work: Path, **env: str) -> str:
    """Run the script's report phase on ``work`` as a user would; its output (the phase must succeed)."""
    proc = subprocess.run(["bash", "benchmarks/gpu/learning_proof.sh", str(work), "report"], cwd=REPO,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def test_the_report_covers_the_evals_that_exist_and_names_the_missing_seed(tmp_path) -> None:
    work = tmp_path / "lp"
    _eval_run(work / "logs", "eval_all_seed42", failed={2, 7, 41})
    _eval_run(work / "logs", "eval_extra_seed43", failed={7, 13})
    out = _report(work, LP_EXTRA_SEEDS="43 44")
    assert "seed 44 is not in the report" in out
    report = json.loads((work / "report.json").read_text())
    trained = report["trained"]["success_once"]["overall"]
    held_out = report["held_out"]["success_once"]["overall"]
    assert (trained["successes"], trained["trials"]) == (80 - 4, 80)  # 2 and 7 (seed 42), 7 and 13 (seed 43)
    assert (held_out["successes"], held_out["trials"]) == (20 - 1, 20)  # 41 (seed 42)
    assert len(report["trained"]["sources"]) == 2
    # the verdict on the learning proof's targets (>= 90 % trained, >= 60 % held out), from those figures
    assert "target trained >= 90%: met - 95.0% (76/80)" in out
    assert "target held_out >= 60%: met - 95.0% (19/20)" in out


def test_the_report_says_when_a_target_is_not_met(tmp_path) -> None:
    work = tmp_path / "lp"
    _eval_run(work / "logs", "eval_all_seed42", failed=set(range(10)) | {40, 41, 42, 43, 44})
    out = _report(work, LP_EXTRA_SEEDS="")
    assert "target trained >= 90%: NOT met - 75.0% (30/40)" in out
    assert "target held_out >= 60%: NOT met - 50.0% (5/10)" in out


def test_several_tasks_are_judged_on_held_out_states_per_task(tmp_path) -> None:
    """One model for several tasks (``LP_TASK=0-1``): the goal is >= 50 % on held-out init states for each."""
    work = tmp_path / "lp"
    _eval_run(work / "logs", "eval_all_seed42", failed=set(), tasks={0: {3, 41}, 1: {40, 41, 42, 43, 44, 45}})
    out = _report(work, LP_EXTRA_SEEDS="", LP_TASK="0-1")
    assert "target held_out task 0 >= 50%: met - 90.0% (9/10)" in out
    assert "target held_out task 1 >= 50%: NOT met - 40.0% (4/10)" in out
    assert "target trained" not in out


def _goal_rows(task: int, trials: range, fails: set[int], *, source: int | None = None,
               instruction: str | None = None) -> list[dict]:
    words = {1: "put the bowl on the stove", 4: "put the bowl on top of the cabinet", 8: "put the bowl on the plate"}
    return [{"suite": "libero_goal", "task_id": task, "trial_id": t, "success_once": t not in fails,
             "success_at_end": t not in fails, "steps": 300 if t in fails else 110, "error": None, "slot_id": 0,
             "attempts": 1, "video": None, "task_description": words[task],
             "instruction": words[task] if instruction is None else instruction,
             "init_state_task_id": task if source is None else source}
            for t in trials]


def _write_run(logs: Path, name: str, rows: list[dict]) -> None:
    run = logs / name / "20261205-150000-libero_goal_cosmos3_eval_small"
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_language_proof_report_judges_swap_ablation_and_fisher(tmp_path) -> None:
    """libero_goal, three bowl tasks: held out 27/30 (each >= 60 %), the swap 8/9 at the instructed goal,
    the ablated instruction 9/30 (<= 1/3 + 10 points), and instructed > ablated by Fisher's one-sided test
    (27/30 vs 9/30: p far below 0.01)."""
    logs = tmp_path / "lp" / "logs"
    held = range(40, 50)
    _write_run(logs, "eval_all_seed42", _goal_rows(1, held, {40}) + _goal_rows(4, held, {41}) + _goal_rows(8, held, {42}))
    _write_run(logs, "eval_swap_seed42", _goal_rows(8, range(3), {1}, source=1) + _goal_rows(1, range(3), set(), source=4)
               + _goal_rows(4, range(3), set(), source=8))
    _write_run(logs, "eval_ablate_seed42", _goal_rows(1, held, set(range(40, 47)), instruction="")
               + _goal_rows(4, held, set(range(40, 47)), instruction="")
               + _goal_rows(8, held, set(range(40, 47)), instruction=""))
    out = _report(tmp_path / "lp", LP_SUITE="libero_goal", LP_TASK="1,4,8", LP_EXTRA_SEEDS="",
                  LP_SWAP="8:1 1:4 4:8", LP_SWAP_STATES="0-2")
    assert "target held_out (all tasks) >= 80%: met - 90.0% (27/30)" in out
    assert "target held_out task 4 >= 60%: met - 90.0% (9/10)" in out
    assert "target swap (instructed goal from another task's init states) >= 70%: met - 88.9% (8/9)" in out
    assert "target ablated instruction (3 tasks) <= 43%: met - 30.0% (9/30)" in out
    assert "target instructed > ablated (one-sided Fisher p < 0.01): met" in out
    report = json.loads((tmp_path / "lp" / "report.json").read_text())
    assert report["ablation_test"]["pooled"]["p_worse"] < 1e-4
    labels = {c["label"] for c in report["swap"]["success_once"]["conditions"]}
    assert any("8 from task 1" in label for label in labels), labels


def _with_videos(run: Path, rows: list[dict], color: int) -> list[dict]:
    """Give every row a real episode video (the eval's own writer, 4 frames of one ``color``) under ``run``."""
    from rlinf_cosmos3.workers.env.video import EpisodeVideoWriter

    for row in rows:
        name = f"videos/task{row['task_id']}_trial{row['trial_id']}.mp4"
        writer = EpisodeVideoWriter(run / name, fps=10)
        frames = np.full((4, 32, 32, 3), color, dtype=np.uint8)
        writer.add(frames, frames)
        writer.finish()
        row["video"] = name
    return rows


def test_the_language_proof_keeps_a_video_of_a_swapped_success(tmp_path) -> None:
    """With the swap control, the report phase keeps the first swapped success's video as ``swap.mp4`` beside
    ``success.mp4`` and ``failure.mp4`` (the first eval's), and says which task it did from which task's state."""
    logs = tmp_path / "lp" / "logs"
    held = range(40, 43)
    first = logs / "eval_all_seed42" / "20261205-150000-libero_goal_cosmos3_eval_small"
    swap = logs / "eval_swap_seed42" / "20261205-150000-libero_goal_cosmos3_eval_small"
    first.mkdir(parents=True)
    swap.mkdir(parents=True)
    rows = _with_videos(first, _goal_rows(1, held, {40}), color=40)
    (first / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    swapped = _with_videos(swap, _goal_rows(8, range(2), {0}, source=1), color=200)
    (swap / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in swapped))
    out = _report(tmp_path / "lp", LP_SUITE="libero_goal", LP_TASK="1,8", LP_EXTRA_SEEDS="", LP_SWAP="8:1",
                  LP_SWAP_STATES="0-1")
    assert "swap video: task 8, init state 1 of task 1" in out, out
    for name, video in (("success", first / "videos/task1_trial41.mp4"), ("failure", first / "videos/task1_trial40.mp4"),
                        ("swap", swap / "videos/task8_trial1.mp4")):
        assert (tmp_path / "lp" / f"{name}.mp4").read_bytes() == video.read_bytes(), name


def test_a_refused_training_launch_does_not_cost_the_report(tmp_path) -> None:
    """A first SFT launch refused for its config leaves a run directory without scalars in logs/sft; the report
    still draws the curves of the run that trained, and the results of the evals."""
    from rlinf_cosmos3.tracking import ScalarWriter

    work = tmp_path / "lp"
    refused = work / "logs" / "sft" / "20261207-132300-libero_sft_cosmos3_small"
    refused.mkdir(parents=True)
    (refused / "run_embodiment.log").write_text("ERROR rlinf_cosmos3.sft: invalid config: ...\n")
    with ScalarWriter(work / "logs" / "sft" / "20261207-132501-libero_sft_cosmos3_small" / "tensorboard",
                      prefix="train") as writer:
        for step in (1, 2):
            writer.log({"loss": 3.0 / step, "action_loss": 1.0 / step, "lr": 1e-4, "grad_norm": 1.0}, step=step)
    _eval_run(work / "logs", "eval_all_seed42", failed={2})
    out = _report(work, LP_EXTRA_SEEDS="")
    assert "no train/loss scalars" not in out and (work / "training_curves.png").stat().st_size > 10_000
    assert json.loads((work / "report.json").read_text())["trained"]["success_once"]["overall"]["successes"] == 39
