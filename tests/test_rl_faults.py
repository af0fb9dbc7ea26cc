"""RL end to end on CPU under a fault and with the online evaluation: the launcher, real LIBERO env workers, the
tiny Cosmos3 (the fixtures and helpers of tests/test_rl_e2e.py).

- A simulator SIGKILLed mid-episode (after its first decision has been played): the env slot replaces the process
  and re-runs the episode, the crashed attempt's decisions are neither trained on nor counted (PPO, so that every
  kept decision is in the update and the update's decision count shows what was kept), the run finishes and
  checkpoints, and nothing is left running.
- ``runner.eval_interval=1``: SFT's online evaluation (through ``sft_view``) evaluates the RL checkpoint, its summary
  lands under ``<run>/online_eval/step_1/`` and its rates in the run's TensorBoard as ``eval/*``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_rl_e2e import RUN_MARK, _assert_nothing_left, _command, _marked, _scalars

from rlinf_cosmos3.checkpoint import is_complete_checkpoint
from rlinf_cosmos3.checkpoint.layout import TRAINER_STATE_FILE, actor_dir
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.procgroup import processes_with_env
from rlinf_cosmos3.runners.online_eval import ONLINE_EVAL_TAG_ENV

pytestmark = [pytest.mark.slow, pytest.mark.libero]

OBSERVATION_BYTES = 2 * 256 * 256 * 3
"""The two camera images of one simulator reply (``env.image_size`` 256): the bulk of what a reply writes."""
EVAL_OVERRIDES = ["env.eval.init_state_ids=[0]", "env.eval.total_num_envs=1", "rollout.pipeline_stage_num=1",
                  "env.eval.max_episode_steps=26", "env.eval.save_video=none", "rollout.model.num_inference_steps=2"]


def _written(pid: int) -> int:
    """Bytes the process has written so far (``/proc/<pid>/io``'s wchar): its replies on stdout, mostly."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError(f"no wchar in /proc/{pid}/io")


def _kill_mid_episode(mark: str, out_file: Path, after: str, killed: dict) -> None:
    """Fault injected: once ``after`` is in the run's output (the round before has ended, the kept simulators wait
    idle for the next one), SIGKILL one of the run's simulators as soon as it has written three observations since
    (the next episode's reset, settle, the first decision's chunk): its episode has a decision played and one to go."""
    deadline = time.monotonic() + 600
    while after not in out_file.read_text():
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    sims = sorted(pid for pid, cmd in _marked(mark) if "rlinf_cosmos3.sim.libero_server" in cmd)
    if not sims:
        return
    pid = sims[0]
    start = _written(pid)
    while time.monotonic() < deadline:
        if _written(pid) - start >= 3 * OBSERVATION_BYTES:
            os.kill(pid, 9)
            killed["pid"] = pid
            return
        time.sleep(0.02)


def test_a_killed_simulator_reruns_its_episode_uncounted(tiny_model_and_stats, tmp_path: Path) -> None:
    """SIGKILL one simulator mid-episode in iteration 2 of 2 (PPO): the episode re-runs in a new process, the
    crashed attempt's decisions are dropped (``dropped_decisions``) and neither trained on (``update_decisions``)
    nor counted (``decisions_total``, the checkpoint's counters), the run checkpoints and leaves nothing behind."""
    mark = os.urandom(6).hex()
    out_file = tmp_path / "out.txt"
    killed: dict = {}
    with open(out_file, "w") as out:
        proc = subprocess.Popen(_command(tiny_model_and_stats, tmp_path, "algorithm.name=ppo"), cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, RUN_MARK: mark})
    killer = threading.Thread(target=_kill_mid_episode, args=(mark, out_file, "iteration 1/2: success", killed),
                              daemon=True)
    killer.start()
    code = proc.wait(timeout=900)
    killer.join(timeout=5)
    output = out_file.read_text()
    assert code == 0, output[-5000:]
    assert killed, "no simulator was killed"
    _assert_nothing_left(mark)

    (run_dir,) = list((tmp_path / "logs").iterdir())
    log = (run_dir / "rl_embodiment.log").read_text()
    assert "left out of the round" not in log  # the episode was re-run, not given up
    assert "ran 2 times (simulator crash); only the last run's 2 decisions count" in log, log[-4000:]
    assert "iteration 2: update: 4 of 4 decisions" in log
    assert "iteration 2/2: success" in log and "Ray stopped" in log
    scalars = _scalars(run_dir)
    dropped = scalars["dropped_decisions"][2]
    assert scalars["dropped_decisions"][1] == 0 and dropped >= 1  # the crashed attempt had played a decision
    assert scalars["failed_episodes"] == {1: 0.0, 2: 0.0}
    assert scalars["update_decisions"] == {1: 4.0, 2: 4.0}  # 2 episodes x 2 decisions: the crashed attempt's out
    assert scalars["episodes_total"] == {1: 2.0, 2: 4.0}
    assert scalars["env_steps_total"] == {1: 84.0, 2: 168.0}
    assert scalars["decisions_total"] == {1: 4.0, 2: 8.0}
    ckpts = tmp_path / "ckpts" / "libero_rl_cosmos3_tiny" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["global_step_1", "global_step_2"]
    assert is_complete_checkpoint(ckpts / "global_step_2")
    state = TrainerState.read(actor_dir(ckpts / "global_step_2") / TRAINER_STATE_FILE)
    assert state.extra["rl"] == {"iteration": 2, "episodes": 4.0, "env_steps": 168.0, "decisions": 8.0}


def test_online_eval_evaluates_the_rl_checkpoint(tiny_model_and_stats, tmp_path: Path) -> None:
    """One iteration with ``runner.eval_interval=1``: the driver evaluates ``global_step_1`` with the tiny eval
    config (embedded backend, one episode), waits for it, logs ``eval/*`` at step 1, and leaves nothing running."""
    mark = os.urandom(6).hex()
    overrides = ",".join(f'"{o}"' for o in EVAL_OVERRIDES)
    cmd = _command(tiny_model_and_stats, tmp_path, "runner.max_iterations=1", "runner.eval_interval=1",
                   "runner.online_eval.config_name=libero_spatial_cosmos3_eval_tiny",
                   f"runner.online_eval.overrides=[{overrides}]")
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, RUN_MARK: mark})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    _assert_nothing_left(mark)

    (run_dir,) = list((tmp_path / "logs").iterdir())
    eval_root = run_dir / "online_eval"
    assert not processes_with_env(ONLINE_EVAL_TAG_ENV, str(eval_root).__eq__)
    log = (run_dir / "rl_embodiment.log").read_text()
    milestones = ["online eval: every 1 steps", "iteration 1/1: success", "saved checkpoint",
                  "online eval of step 1 started", "online eval of step 1: success_once", "Ray stopped"]
    positions = [log.find(m) for m in milestones]
    assert all(p >= 0 for p in positions), dict(zip(milestones, positions, strict=True))
    (summary_file,) = list((eval_root / "step_1").glob("*-libero_spatial_cosmos3_eval_tiny/summary.json"))
    summary = json.loads(summary_file.read_text())
    assert summary["num_trajectories"] == 1 and summary["num_errors"] == 0
    assert not (eval_root / "step_1" / "model").exists()  # the converted model is removed after its evaluation

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("eval/success_once")] == [(1, summary["success_once"])]
    assert [(s.step, s.value) for s in events.Scalars("eval/num_trajectories")] == [(1, 1.0)]
    assert sorted(_scalars(run_dir)["success_rate"]) == [1]
