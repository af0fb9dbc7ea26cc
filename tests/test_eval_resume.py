"""Resuming an interrupted eval (``runner.resume_dir``).

Config side (fast): the driver entry ``run_eval`` in-process on the real tiny YAML, refusing a resume
whose episodes were defined differently before Ray starts, reading a torn results.jsonl, re-running
errored episodes, and only rewriting the summary when nothing is missing.

End to end (slow): the real simulator and the embedded backend on CPU. An uninterrupted eval, then
an identical one through ``run_eval.sh`` killed with SIGKILL part way (leaving nothing running), then
that one resumed: same counts, each (task, trial) once, and the same per-episode outcome. Per episode the outcome does not depend on which episodes
share the process: the simulator is rebuilt with ``env.eval.seed`` and reset to the fixed init state,
and every embedded request carries ``rollout.model.seed`` (observation ``i`` of a request draws with
``seed + i``); with one env per stage (here one env in all), each request holds one observation, so the resumed
episodes get exactly the noise they got in the uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from process_checks import nothing_left_running

from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.runners.eval_resume import prepare_resume
from rlinf_cosmos3.tracking.results_file import RESULTS_FILE
from rlinf_cosmos3.validation.eval import load_eval_config

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "evaluations" / "libero"
TINY = "libero_spatial_cosmos3_eval_tiny"


@pytest.fixture(scope="module")
def inputs(tiny_model_and_stats) -> dict:
    return {"model": tiny_model_and_stats.model, "stats": tiny_model_and_stats.stats}


def _overrides(inputs: dict, logs: Path, *extra: str) -> list[str]:
    return [f"rollout.model.model_path={inputs['model']}", f"rollout.model.action_stats_path={inputs['stats']}",
            f"runner.logs_dir={logs}", *extra]


def _raw(inputs: dict, logs: Path, *extra: str) -> dict:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return OmegaConf.to_container(compose(TINY, overrides=_overrides(inputs, logs, *extra)), resolve=True)


def _row(trial: int, error: str | None = None, success: bool = False) -> dict:
    return {"suite": "libero_spatial", "task_id": 0, "trial_id": trial, "success_once": success,
            "success_at_end": success, "steps": 42, "video_path": None, "error": error, "slot_id": trial,
            "attempts": 1, "task_description": "pick", "video": None}


def _old_run(inputs: dict, tmp_path: Path, lines: list[str]) -> Path:
    """A run directory as an eval leaves it: config.yaml (the tiny YAML: task 0, trials 0 and 1) and results.jsonl."""
    run = tmp_path / "old_run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(_raw(inputs, tmp_path / "logs")))
    (run / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


def test_a_resume_with_another_task_list_is_refused_before_ray(inputs, tmp_path) -> None:
    from rlinf_cosmos3.runners.eval_runner import run_eval

    run = _old_run(inputs, tmp_path, [json.dumps(_row(0))])
    with nothing_left_running():
        code = run_eval(_raw(inputs, tmp_path / "logs", "env.eval.task_ids=[1]", f"runner.resume_dir={run}"), "x")
    assert code == 2
    log = (run / "eval_embodiment.log").read_text()
    assert "invalid config: config field 'runner.resume_dir'" in log and "env.eval.task_ids: [0] -> [1]" in log, log
    assert "(fix: " in log and "Ray " not in log and "evaluating" not in log
    assert (run / "results.jsonl").read_text().count("\n") == 1  # untouched


def test_a_resume_dir_that_is_not_a_run_is_refused(inputs, tmp_path) -> None:
    from rlinf_cosmos3.runners.eval_runner import run_eval

    assert run_eval(_raw(inputs, tmp_path / "logs", f"runner.resume_dir={tmp_path}"), "x") == 2
    (new,) = (tmp_path / "logs").glob("*-x")
    log = (new / "eval_embodiment.log").read_text()
    assert "config field 'runner.resume_dir'" in log and f"has no {RESULTS_FILE}" in log and "Ray " not in log


def test_a_torn_last_line_and_an_errored_episode_are_run_again(inputs, tmp_path) -> None:
    run = _old_run(inputs, tmp_path, [json.dumps(_row(1, error="simulator crashed")), json.dumps(_row(0))[:-9]])
    cfg = load_eval_config(_raw(inputs, tmp_path / "logs", f"runner.resume_dir={run}"), check_gpus=False)
    state = prepare_resume(cfg)
    assert state.kept == [] and [(e.task_id, e.trial_id) for e in state.remaining] == [(0, 0), (0, 1)] and state.rerun_errors == 1
    assert (run / "results.jsonl").read_text() == ""  # only complete, error-free rows stay

    (run / "results.jsonl").write_text(json.dumps(_row(1, success=True)) + "\n")
    state = prepare_resume(cfg)
    assert [(r.trial_id, r.success_once) for r in state.kept] == [(1, True)]
    assert [(e.task_id, e.trial_id) for e in state.remaining] == [(0, 0)]


def test_a_two_suite_run_resumes_the_missing_suites_episodes_only(inputs, tmp_path) -> None:
    two = ("env.eval.suites=[libero_spatial,libero_object]", "env.eval.init_state_ids=[0]")
    run = tmp_path / "old_run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(_raw(inputs, tmp_path / "logs", *two)))
    (run / "results.jsonl").write_text(json.dumps(_row(0, success=True)) + "\n")  # libero_spatial task 0, init 0
    cfg = load_eval_config(_raw(inputs, tmp_path / "logs", *two, f"runner.resume_dir={run}"), check_gpus=False)
    state = prepare_resume(cfg)
    assert [(r.suite, r.task_id, r.trial_id) for r in state.kept] == [("libero_spatial", 0, 0)]
    assert [(e.suite, e.task_id, e.trial_id) for e in state.remaining] == [("libero_object", 0, 0)]

    (run / "results.jsonl").write_text(json.dumps({**_row(0), "suite": "libero_goal"}) + "\n")
    with pytest.raises(ConfigError, match="of suite 'libero_goal', not one of this config's"):
        prepare_resume(cfg)
    one = load_eval_config(_raw(inputs, tmp_path / "logs", "env.eval.init_state_ids=[0]", f"runner.resume_dir={run}"),
                           check_gpus=False)
    with pytest.raises(ConfigError, match=r"env.eval.suites: \['libero_spatial', 'libero_object'\] -> \['libero_spatial'\]"):
        prepare_resume(one)


def test_nothing_missing_rewrites_the_summary_without_ray(inputs, tmp_path) -> None:
    from rlinf_cosmos3.runners.eval_runner import run_eval

    run = _old_run(inputs, tmp_path, [json.dumps(_row(0, success=True)), json.dumps(_row(1))])
    with nothing_left_running():
        assert run_eval(_raw(inputs, tmp_path / "logs", f"runner.resume_dir={run}"), "x") == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_trajectories"] == 2 and summary["success_once"] == 0.5 and summary["resumed_episodes"] == 2
    log = (run / "eval_embodiment.log").read_text()
    assert "2 episodes kept, 0 to run" in log and "Ray " not in log and not (tmp_path / "logs").exists()


# ---------------------------------------------------------------------------------------------- end to end
E2E = ("rollout.rollout_backend=embedded", "env.eval.total_num_envs=1", "rollout.pipeline_stage_num=1",
       "env.eval.max_episode_steps=26", "env.eval.save_video=none", "env.eval.stop_on_success=false")
"""The tiny YAML's 2 episodes (task 0, init states 0 and 1), one chunk each, in turn on one env, so each
request holds one observation and an episode draws the same noise whichever episodes share the run."""
COUNTS = ("num_trajectories", "success_once", "success_at_end", "num_errors", "env_steps", "per_task", "step_cap")
E2E_EPISODES = [(0, 0), (0, 1), (0, 2), (0, 3)]
E2E_KILL = (*E2E, "env.eval.init_state_ids=[0,1,2,3]", "env.eval.max_episode_steps=42")
"""Four episodes of two chunks each, so that a kill after the first episode leaves some to run."""


def _outcomes(run: Path, episodes: list[tuple[int, int]]) -> dict[tuple[int, int], tuple]:
    rows = [json.loads(line) for line in (run / RESULTS_FILE).read_text().splitlines()]
    keys = [(r["task_id"], r["trial_id"]) for r in rows]
    assert sorted(keys) == episodes, keys  # each episode exactly once
    return {(r["task_id"], r["trial_id"]): (r["success_once"], r["success_at_end"], r["steps"], r["error"])
            for r in rows}


def _complete_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a row the kill cut off: the resumed run drops it too
            continue
    return rows


def _started_by(pid: int) -> list:
    """Live processes a driver started (its Cluster's ``DRIVER_ENV`` tag)."""
    from rlinf_cosmos3.cluster.reaper import DRIVER_ENV
    from rlinf_cosmos3.procgroup import processes_with_env

    return processes_with_env(DRIVER_ENV, lambda value: value.startswith(f"{pid}:"))


@pytest.mark.slow
@pytest.mark.libero
def test_a_run_killed_with_sigkill_and_resumed_matches_the_uninterrupted_run(inputs, tmp_path) -> None:
    """An uninterrupted run; the same run through run_eval.sh, SIGKILLed once its first episode is written
    (nothing of it may keep running); that run resumed: the uninterrupted run's counts and per-episode
    outcomes, each episode exactly once."""
    import signal
    import subprocess
    import time

    from rlinf_cosmos3.runners.eval_runner import run_eval

    with nothing_left_running():
        assert run_eval(_raw(inputs, tmp_path / "full", *E2E_KILL), "x") == 0
    (full,) = (tmp_path / "full").iterdir()

    proc = subprocess.Popen(["bash", str(REPO / "evaluations/run_eval.sh"), "libero", TINY,
                             *_overrides(inputs, tmp_path / "killed", *E2E_KILL)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        rows = [f.read_text() for f in (tmp_path / "killed").glob(f"*/{RESULTS_FILE}")]
        if rows and rows[0].count("\n") >= 1:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while (left := _started_by(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "left running by the killed eval: " + "; ".join(" ".join(p.cmdline())[:100] for p in left)
    (killed,) = (tmp_path / "killed").iterdir()
    kept = len(_complete_rows(killed / RESULTS_FILE))
    assert 1 <= kept < len(E2E_EPISODES), kept

    with nothing_left_running():
        assert run_eval(_raw(inputs, tmp_path / "unused", *E2E_KILL, f"runner.resume_dir={killed}"), "x") == 0
    assert not (tmp_path / "unused").exists()  # the resumed run writes into the run it finishes
    log = (killed / "eval_embodiment.log").read_text()
    assert f"{kept} episodes kept, {len(E2E_EPISODES) - kept} to run" in log
    assert _outcomes(killed, E2E_EPISODES) == _outcomes(full, E2E_EPISODES)
    a, b = (json.loads((run / "summary.json").read_text()) for run in (full, killed))
    assert {k: a[k] for k in COUNTS} == {k: b[k] for k in COUNTS} and b["resumed_episodes"] == kept
