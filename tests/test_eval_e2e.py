"""Evaluation end to end on CPU: real LIBERO env workers, a real SGLang server (or the embedded
diffusers backend), the pipelined runner, and the documented outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.libero]

REPO = Path(__file__).resolve().parent.parent
LEFTOVER_PATTERNS = ("rlinf_cosmos3.sim.libero_server", "sglang serve", "sgl_diffusion")
RUN_MARK = "RLINF_COSMOS3_TEST_RUN"
"""Environment variable set on each eval subprocess: every process it starts (Ray workers, simulators,
servers) inherits it, so checks and fault injection touch this run's processes only, never those of
another run on the same machine."""


@pytest.fixture(scope="module")
def eval_inputs(recorded_libero_dataset, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval")
    episodes = read_lerobot_episode_actions(recorded_libero_dataset.root)
    stats = compute_action_stats(episodes.episodes, metadata={"fps": recorded_libero_dataset.fps})
    return {"model": write_model_dir(root / "model", preset="tiny", seed=0),
            "stats": write_action_stats(stats, root / "stats.json")}


def _marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment carries ``RUN_MARK=mark``."""
    needle = f"{RUN_MARK}={mark}".encode()
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                out.append((int(pid), cmd))
    return out


def _run_eval(inputs: dict[str, Path], logs: Path, *extra: str, mark: str | None = None
              ) -> tuple[subprocess.CompletedProcess, Path | None]:
    mark = mark or os.urandom(6).hex()
    proc = subprocess.run(
        ["bash", str(REPO / "evaluations/run_eval.sh"), "libero", "libero_spatial_cosmos3_eval_tiny",
         f"rollout.model.model_path={inputs['model']}", f"rollout.model.action_stats_path={inputs['stats']}",
         f"runner.logs_dir={logs}", "env.eval.max_episode_steps=26", *extra],
        capture_output=True, text=True, timeout=1500, env={**os.environ, RUN_MARK: mark},
    )
    deadline = time.monotonic() + 20  # process groups are reaped asynchronously after exit
    while (left := [c for _, c in _marked(mark) if any(p in c for p in LEFTOVER_PATTERNS)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left behind after the eval: {left}"
    runs = sorted(logs.iterdir()) if logs.exists() else []
    return proc, (runs[-1] if runs else None)


def _check_outputs(run_dir: Path, backend_lines: tuple[str, ...], steps: int = 26,
                   suites: tuple[str, ...] = ("libero_spatial",)) -> None:
    """Each (suite, task, trial) exactly once, run to the cap, and every documented output in place.
    One suite: task 0, init states 0 and 1; several: task 0, init state 0 of each."""
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    expected = [(s, 0, i) for s in suites for i in ((0, 1) if len(suites) == 1 else (0,))]
    assert sorted((r["suite"], r["task_id"], r["trial_id"]) for r in results) == sorted(expected)
    assert all(r["steps"] == steps and r["error"] is None for r in results)
    summary = json.loads((run_dir / "summary.json").read_text())
    n = len(expected)
    assert summary["num_trajectories"] == n and summary["env_steps"] == n * steps
    assert summary["step_cap"] == (steps if len(suites) == 1 else dict.fromkeys(suites, steps))
    assert summary["suites"] == list(suites) and summary["suite"] == "+".join(suites)
    assert 0.0 <= summary["success_once"] <= 1.0 and summary["env_steps_per_s"] > 0
    low, high = summary["success_once_ci95"]
    assert low <= summary["success_once"] <= high
    for suite in suites:
        task = summary["per_task"]["0" if len(suites) == 1 else f"{suite}/0"]
        assert task == summary["per_suite"][suite]["per_task"]["0"]
        assert task["num_trajectories"] == n // len(suites)
        assert task["success_once_ci95"][0] <= task["success_once"] <= task["success_once_ci95"][1]
    assert (run_dir / "success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log = (run_dir / "eval_embodiment.log").read_text()
    milestones = [*backend_lines, "[libero eval] task_id=0, trial_id=0", "success rates, Wilson 95 % intervals",
                  "summary: success_once="]
    for suite in suites:  # the printed table's line of each suite, with its cap
        assert re.search(rf"^{suite} +all \(cap {steps} steps\)", log, re.M), log[-3000:]
    positions = [log.find(m) for m in milestones]
    assert all(p >= 0 for p in positions), dict(zip(milestones, positions, strict=True))
    assert positions == sorted(positions), "milestones out of order"
    assert list((run_dir / "tensorboard").iterdir())


def test_embedded_backend_is_one_override_and_evaluates_two_suites_in_one_run(eval_inputs, tmp_path) -> None:
    """The embedded backend, and several suites in one run: each suite's episodes on its own scenes,
    one summary with per-suite rates and the table printed at the end."""
    suites = ("libero_spatial", "libero_object")
    proc, run_dir = _run_eval(eval_inputs, tmp_path / "logs", "rollout.rollout_backend=embedded",
                              "env.eval.save_video=false", f"env.eval.suites=[{','.join(suites)}]",
                              "env.eval.init_state_ids=[0]")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_outputs(run_dir, ("rollout backend embedded ready",), suites=suites)
    descriptions = {r["suite"]: r["task_description"] for r in map(json.loads, (run_dir / "results.jsonl").open())}
    assert descriptions["libero_spatial"] != descriptions["libero_object"]  # each suite's own task 0


def test_layout_error_names_fields_before_anything_starts(eval_inputs, tmp_path) -> None:
    proc, run_dir = _run_eval(eval_inputs, tmp_path / "logs", "env.eval.total_num_envs=3")
    assert proc.returncode == 2
    log = (run_dir / "eval_embodiment.log").read_text()
    assert "env.eval.total_num_envs" in log and "rollout.pipeline_stage_num=2" in log
    assert "Launching sglang server" not in log and "Ray started" not in log


def _server_pids(mark: str) -> list[int]:
    """Main processes of this run's SGLang servers."""
    return [pid for pid, cmd in _marked(mark) if "sglang" in cmd and " serve " in cmd]


def test_sglang_eval_survives_a_killed_server_and_writes_documented_outputs(eval_inputs, tmp_path) -> None:
    """The SGLang eval end to end, with fault injection (one run serves both, since each costs minutes on
    CPU): SIGKILL the server once the eval is under way; it is restarted, the in-flight request retried,
    every (task, trial) is reported exactly once, and the run still leaves every documented output."""
    import signal
    import threading

    logs = tmp_path / "logs"
    mark = os.urandom(6).hex()
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not killed:
            runs = list(logs.iterdir()) if logs.exists() else []
            log = runs[0] / "eval_embodiment.log" if runs else None
            if log is not None and log.exists() and "rollout backend sglang ready" in log.read_text():
                time.sleep(2.0)  # let the first requests get in flight
                for pid in _server_pids(mark):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return
            time.sleep(0.5)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    proc, run_dir = _run_eval(eval_inputs, logs, "env.eval.max_episode_steps=42", mark=mark)
    thread.join(timeout=5)
    assert killed, "the server was never seen running"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run_dir / "eval_embodiment.log").read_text()
    assert "restarting sglang server rank 0" in log
    _check_outputs(run_dir, ("Launching sglang server", "sglang server assigned: rank=0 -> http://127.0.0.1:"), steps=42)
    videos = sorted((run_dir / "videos").rglob("*.mp4"))
    assert len(videos) == 2 and all(v.stat().st_size > 0 for v in videos)
