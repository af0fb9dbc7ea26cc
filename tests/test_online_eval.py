"""Evaluation during SFT on CPU: real LIBERO, the real tiny Cosmos3 trained by real Ray ranks (gloo).

One launcher run with ``runner.eval_interval=2`` over 4 steps: the evaluation of step 2 is killed with
SIGKILL half-way (the fault a machine's out-of-memory killer injects), which must cost training nothing;
step 4's evaluation runs to the end and lands in the run's TensorBoard as ``eval/*`` at step 4.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.procgroup import processes_with_env
from rlinf_cosmos3.runners.online_eval import ONLINE_EVAL_TAG_ENV

pytestmark = [pytest.mark.slow, pytest.mark.libero]

REPO = Path(__file__).resolve().parent.parent
EVAL_OVERRIDES = ["env.eval.init_state_ids=[0]", "env.eval.total_num_envs=1", "rollout.pipeline_stage_num=1",
                  "env.eval.max_episode_steps=26", "env.eval.save_video=none", "rollout.model.num_inference_steps=2"]


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``ONLINE_EVAL_TAG_ENV=tag`` (an evaluation and everything it started)."""
    return processes_with_env(ONLINE_EVAL_TAG_ENV, tag.__eq__)


def _kill_first_eval(tag: str, killed: dict) -> None:
    """Fault injected: SIGKILL the first evaluation's process group once its simulator runs."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        procs = _tagged(tag)
        job = next((p for p in procs if "online_eval_job" in " ".join(p.cmdline())), None)
        if job is not None and any("libero" in " ".join(p.cmdline()).lower() and p.pid != job.pid for p in procs):
            killed["pid"] = job.pid
            os.killpg(job.pid, signal.SIGKILL)
            return
        time.sleep(0.5)


def test_sft_evaluates_its_checkpoints_and_survives_a_killed_evaluation(recorded_libero_dataset, tmp_path) -> None:
    episodes = read_lerobot_episode_actions(recorded_libero_dataset.root)
    stats = write_action_stats(compute_action_stats(episodes.episodes, metadata={"fps": recorded_libero_dataset.fps}),
                               tmp_path / "stats.json")
    model = write_model_dir(tmp_path / "tiny_model", preset="tiny", seed=0)
    overrides = ",".join(f'"{o}"' for o in EVAL_OVERRIDES)
    cmd = ["bash", str(REPO / "examples/sft/run_vla_sft.sh"), "libero_sft_cosmos3_tiny",
           f"actor.model.model_path={model}", f"data.dataset.root={recorded_libero_dataset.root}",
           f"data.dataset.stats_path={stats}", f"runner.log_path={tmp_path / 'ckpts'}",
           f"runner.logs_dir={tmp_path / 'logs'}", "runner.max_steps=4", "runner.save_interval=2",
           "actor.optim.total_training_steps=10", "actor.optim.lr_warmup_steps=2",
           "data.num_workers=0", "runner.eval_interval=2",
           "runner.online_eval.config_name=libero_spatial_cosmos3_eval_tiny",
           f"runner.online_eval.overrides=[{overrides}]"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # The run directory (and so the tag) exists once the driver has started.
    deadline = time.monotonic() + 300
    while not list((tmp_path / "logs").glob("*/online_eval")) and time.monotonic() < deadline:
        time.sleep(0.5)
    (eval_root,) = list((tmp_path / "logs").glob("*/online_eval"))
    killed: dict = {}
    killer = threading.Thread(target=_kill_first_eval, args=(str(eval_root), killed), daemon=True)
    killer.start()
    out, _ = proc.communicate(timeout=1500)
    killer.join(timeout=5)
    assert proc.returncode == 0, out[-6000:]
    assert killed, "the first evaluation was never seen running"

    run_dir = eval_root.parent
    log = (run_dir / "run_embodiment.log").read_text()
    assert "online eval of step 2 started" in log and "step 4/4" in log
    assert "online eval of step 2 failed (exit code -9)" in log and "training is not affected" in log
    assert "online eval of step 4: success_once" in log

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    once = events.Scalars("eval/success_once")
    assert [s.step for s in once] == [4] and 0.0 <= once[0].value <= 1.0
    assert [(s.step, s.value) for s in events.Scalars("eval/num_trajectories")] == [(4, 1.0)]
    assert len(events.Scalars("train/loss")) == 4

    (summary_file,) = list((eval_root / "step_4").glob("*-libero_spatial_cosmos3_eval_tiny/summary.json"))
    summary = json.loads(summary_file.read_text())
    assert summary["num_trajectories"] == 1 and summary["success_once"] == once[0].value
    assert not (eval_root / "step_4" / "model").exists() and not (eval_root / "step_2" / "model").exists()
    ckpts = tmp_path / "ckpts" / "libero_sft_cosmos3_tiny" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["global_step_2", "global_step_4"]
    deadline = time.monotonic() + 30  # the evaluations' reapers finish their sweeps
    while (left := _tagged(str(eval_root))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "an evaluation left processes running: " + "; ".join(" ".join(p.cmdline())[:120] for p in left)
