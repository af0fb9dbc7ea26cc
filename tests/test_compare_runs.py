"""toolkits/eval/compare_runs.py as a user runs it: two eval run directories in, a table and an exit code out.

The run directories hold results.jsonl rows written by the eval's own EpisodeResult, so the tool reads
exactly what evaluations/run_eval.sh writes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

from rlinf_cosmos3.workers.env.results import EpisodeResult

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / "toolkits" / "eval" / "compare_runs.py"


def _run_dir(path: Path, counts: dict[int, tuple[int, int]], suite: str = "libero_spatial",
             errored: int = 0) -> Path:
    """A run with ``successes`` of ``trials`` per task (init states 0..trials-1); the first ``errored``
    episodes of task 0 end in an error but carry success flags True, which must count as failures."""
    path.mkdir(parents=True)
    rows = []
    for task, (successes, trials) in counts.items():
        for trial in range(trials):
            error = "simulator crashed" if task == 0 and trial < errored else None
            ok = trial < successes or error is not None
            rows.append(EpisodeResult(suite=suite, task_id=task, trial_id=trial, success_once=ok, success_at_end=ok,
                                      steps=120, error=error).to_dict())
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _load_cli():
    spec = importlib.util.spec_from_file_location("compare_runs_cli", CLI)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_MAIN = _load_cli().main


def _compare(a: Path, b: Path, *extra: str) -> tuple[int, str, str]:
    """The tool's own main() in this process (the subprocess test below covers the script as run)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = _MAIN([str(a), str(b), *extra])
    return rc, out.getvalue(), err.getvalue()


def test_the_script_as_run_exits_with_its_verdict(tmp_path: Path) -> None:
    a = _run_dir(tmp_path / "a", {0: (45, 50)})
    b = _run_dir(tmp_path / "b", {0: (20, 50)})
    done = subprocess.run([sys.executable, str(CLI), str(a), str(b)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 1 and "regression at alpha=0.05: libero_spatial task 0" in done.stdout, done.stderr


def test_a_clear_regression_exits_1_and_is_named(tmp_path: Path) -> None:
    a = _run_dir(tmp_path / "a", {0: (45, 50), 1: (40, 50)})
    b = _run_dir(tmp_path / "b", {0: (20, 50), 1: (41, 50)})
    rc, out, err = _compare(a, b, "--json", str(tmp_path / "cmp.json"))
    assert rc == 1, out + err
    assert "regression at alpha=0.05: libero_spatial task 0" in out and "task 1," not in out.split("regression")[-1]
    doc = json.loads((tmp_path / "cmp.json").read_text())
    t0, t1 = doc["tasks"]
    assert (t0["a"]["successes"], t0["b"]["successes"], t0["b"]["trials"]) == (45, 20, 50)
    assert abs(t0["difference"] - (-0.5)) < 1e-12 and t0["p_worse"] < 1e-6 and t0["p_value"] < 1e-6
    assert abs(t1["difference"] - 0.02) < 1e-12 and t1["p_value"] > 0.5 and t1["p_worse"] > 0.3
    assert doc["pooled"]["a"]["trials"] == 100 and doc["pooled"]["b"]["successes"] == 61
    lo, hi = t0["b"]["ci95"]
    assert lo < 0.4 < hi  # the Wilson interval around 20/50


def test_same_or_better_is_no_regression(tmp_path: Path) -> None:
    a = _run_dir(tmp_path / "a", {0: (30, 50)})
    same = _run_dir(tmp_path / "same", {0: (30, 50)})
    better = _run_dir(tmp_path / "better", {0: (48, 50)})
    rc, out, _ = _compare(a, same)
    assert rc == 0 and "regression at alpha=0.05: none" in out and "+0.0%" in out
    rc, out, _ = _compare(a, better)
    assert rc == 0 and "+36.0%" in out
    rc, _, _ = _compare(better, a)  # the same pair the other way round is a regression
    assert rc == 1


def test_small_samples_need_a_stronger_effect_and_alpha_is_respected(tmp_path: Path) -> None:
    a = _run_dir(tmp_path / "a", {0: (8, 10)})
    b = _run_dir(tmp_path / "b", {0: (5, 10)})  # 80 % -> 50 % on 10 trials: not significant
    rc, out, _ = _compare(a, b)
    assert rc == 0 and "-30.0%" in out
    assert _compare(a, b, "--alpha", "0.2")[0] == 1  # p(B worse) ~0.17


def test_errored_episodes_count_as_failures_and_unshared_tasks_are_listed(tmp_path: Path) -> None:
    a = _run_dir(tmp_path / "a", {0: (10, 10), 1: (5, 10)})
    b = _run_dir(tmp_path / "b", {0: (10, 10), 2: (5, 10)}, errored=4)  # 4 crashed episodes flagged "success"
    rc, out, _ = _compare(a, b, "--json", str(tmp_path / "cmp.json"))
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["tasks"][0]["b"]["successes"] == 6
    assert doc["only_a"] == [["libero_spatial", 1]] and doc["only_b"] == [["libero_spatial", 2]]
    assert "only in A (not compared): libero_spatial task 1" in out and rc == 1  # 10/10 -> 6/10: p ~0.04


def test_init_states_select_the_episodes_compared(tmp_path: Path) -> None:
    """``run:0-39`` compares the trained init states of runs that evaluated 0-49; ``AFTER BEFORE`` reads as a gain."""
    before = _run_dir(tmp_path / "before", {0: (20, 50)})  # init states 0-19 succeed
    after = _run_dir(tmp_path / "after", {0: (45, 50)})  # 0-44 succeed
    rc, out, _ = _compare(f"{after}:0-39", f"{before}:0-39", "--alpha", "0.01", "--json", str(tmp_path / "cmp.json"))
    doc = json.loads((tmp_path / "cmp.json").read_text())
    (task,) = doc["tasks"]
    assert (task["a"]["successes"], task["a"]["trials"], task["b"]["successes"], task["b"]["trials"]) == (40, 40, 20, 40)
    assert rc == 1 and task["p_worse"] < 1e-6 and doc["run_a"] == f"{after.resolve()}:0-39"
    rc, out, _ = _compare(f"{after}:40-49", f"{before}:40-49")
    assert rc == 1 and "+0.0%" not in out  # held out: 5/10 after, 0/10 before
    rc, _, err = _compare(f"{after}:60-69", before)
    assert rc == 2 and "no episode of init states 60-69" in err
    rc, _, err = _compare(f"{after}:x", before)
    assert rc == 2 and "init states must be ids or ranges" in err


def test_bad_inputs_exit_2_with_the_fix(tmp_path: Path) -> None:
    good = _run_dir(tmp_path / "good", {0: (3, 5)})
    other_suite = _run_dir(tmp_path / "goal", {0: (3, 5)}, suite="libero_goal")
    twice = tmp_path / "twice"
    twice.mkdir()
    lines = (good / "results.jsonl").read_text().splitlines()
    (twice / "results.jsonl").write_text("\n".join([*lines, lines[0]]) + "\n")
    cases = [
        ((tmp_path / "nowhere", good), "no results.jsonl in eval run"),
        ((good, twice), "appears twice"),
        ((good, other_suite), "the runs share no task"),
    ]
    for (a, b), text in cases:
        rc, out, err = _compare(a, b, "--json", str(tmp_path / "never.json"))
        assert rc == 2 and text in err, (text, out, err)
    assert _compare(good, good, "--alpha", "1.5")[0] == 2
    assert not (tmp_path / "never.json").exists()
