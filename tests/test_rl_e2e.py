"""RL end to end on CPU: the launcher, real LIBERO env workers (2 envs, one GRPO group of 2), the tiny Cosmos3 as
the collocated actor, 2 iterations with a checkpoint after each; the checkpoint converts with the SFT converter and
the converted model evaluates through ``evaluations/run_eval.sh``; a run resumed from the first checkpoint
reproduces the second exactly; SIGTERM leaves nothing running. The same with ``algorithm.name=ppo``: GAE from the
value head's values, the clipped value loss, the critic in each checkpoint, conversion, and a resume that reproduces
the second iteration's values, losses, weights and value head exactly.

A random tiny model does not succeed in 32 steps, so the update takes no optimizer step here (no group has
signal); the update itself, on the same model, is tested in tests/test_rl_actor.py with advantages given. What the
resume comparison checks here is the rollout: its starts, its simulator episodes, every decision's noise (the
round's mean old log-prob is a fingerprint of all of them) and the counters. PPO does take optimizer steps here
(GAE's advantages are not zero without a success).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf_cosmos3.checkpoint import is_complete_checkpoint, load_full_weights
from rlinf_cosmos3.checkpoint.layout import TRAINER_STATE_FILE, actor_dir
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.models.cosmos3.identity import file_sha256, read_identity
from rlinf_cosmos3.rl.critic import state_from_text
from rlinf_cosmos3.validation.rl import VALUE_HEAD_FILE

pytestmark = [pytest.mark.slow, pytest.mark.libero]

REPO = Path(__file__).resolve().parent.parent
RUN_MARK = "RLINF_COSMOS3_TEST_RUN"
"""Set on each launcher subprocess: every process it starts inherits it, so the leftover check sees this run's only."""
FINGERPRINT = ("success_rate", "episode_length", "episodes_total", "env_steps_total", "decisions_total",
               "rollout_log_prob_mean", "advantage_std", "groups_with_signal")
"""Iteration metrics a resumed run must reproduce exactly."""


def _marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of live, non-zombie processes whose environment carries ``RUN_MARK=mark``."""
    needle = f"{RUN_MARK}={mark}".encode()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                continue
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out.append((int(pid), cmd))
        except OSError:
            continue
    return out


def _assert_nothing_left(mark: str) -> None:
    deadline = time.monotonic() + 30  # process groups are reaped asynchronously after the driver exits
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left behind: {left}"


def _command(inputs, cwd: Path, *extra: str) -> list[str]:
    return ["bash", str(REPO / "examples/rl/run_vla_rl.sh"), "libero_rl_cosmos3_tiny",
            f"rollout.model.model_path={inputs.model}", f"rollout.model.action_stats_path={inputs.stats}",
            f"runner.logs_dir={cwd / 'logs'}", f"runner.log_path={cwd / 'ckpts'}", *extra]


def _launch(inputs, cwd: Path, *extra: str) -> dict[str, Path | str]:
    mark = os.urandom(6).hex()
    started = time.perf_counter()
    proc = subprocess.run(_command(inputs, cwd, *extra), cwd=cwd, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, RUN_MARK: mark})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    _assert_nothing_left(mark)
    (run_dir,) = list((cwd / "logs").iterdir())
    return {"run_dir": run_dir, "ckpts": cwd / "ckpts" / "libero_rl_cosmos3_tiny" / "checkpoints", "out": out,
            "seconds": time.perf_counter() - started}


def _assert_same_weights(a: Path, b: Path) -> None:
    """Two checkpoints hold bit-identical transformer weights."""
    weights_a, weights_b = load_full_weights(a), load_full_weights(b)
    assert weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def _scalars(run_dir: Path, prefix: str = "rl") -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag.removeprefix(f"{prefix}/"): {s.step: s.value for s in events.Scalars(tag)}
            for tag in events.Tags()["scalars"] if tag.startswith(f"{prefix}/")}


@pytest.fixture(scope="module")
def straight_run(tiny_model_and_stats, tmp_path_factory) -> dict:
    return _launch(tiny_model_and_stats, tmp_path_factory.mktemp("rl_straight"))


def test_two_iterations_log_and_checkpoint(straight_run, tiny_model_and_stats) -> None:
    run_dir, ckpts = straight_run["run_dir"], straight_run["ckpts"]
    log = (run_dir / "rl_embodiment.log").read_text()
    milestones = ["actor ready on cpu", "env workers ready: 2 envs", "iteration 1/2: rollout: 2 episodes",
                  "iteration 1: update:", "iteration 1/2: success", "saved checkpoint", "iteration 2/2: rollout",
                  "iteration 2/2: success", "Ray stopped"]
    positions = [log.find(m) for m in milestones]
    assert all(p >= 0 for p in positions), dict(zip(milestones, positions, strict=True))
    assert positions == sorted(positions), "phases out of order"
    scalars = _scalars(run_dir)
    for name in ("success_rate", "episode_length", "episodes_total", "env_steps_total", "advantage_std",
                 "rollout_time_s", "update_time_s", "episodes_per_s", "env_steps_per_s", "rollout_log_prob_mean"):
        assert sorted(scalars[name]) == [1, 2], name
    assert scalars["episodes_total"] == {1: 2.0, 2: 4.0}
    assert scalars["episode_length"] == {1: 32.0, 2: 32.0}  # 42-step cap less 10 settle steps: no success
    assert scalars["env_steps_total"][2] == 4 * 42
    assert set(_scalars(run_dir, "rl_task_success")) == {"0"}
    assert sorted(p.name for p in ckpts.iterdir()) == ["global_step_1", "global_step_2"]
    for step in ckpts.iterdir():
        assert is_complete_checkpoint(step)
        identity = read_identity(step)
        assert identity is not None and identity.stats_sha256 == file_sha256(tiny_model_and_stats.stats)
    state = TrainerState.read(actor_dir(ckpts / "global_step_2") / TRAINER_STATE_FILE)
    assert state.global_step == 2 and state.extra["rl"] == {"iteration": 2, "episodes": 4.0, "env_steps": 168.0,
                                                             "decisions": 8.0}


def test_the_run_plots_success_against_episodes(straight_run, tmp_path: Path) -> None:
    """toolkits/plot_rl.py as a user runs it on the run directory, and the points it draws."""
    done = subprocess.run([sys.executable, str(REPO / "toolkits/plot_rl.py"), str(straight_run["run_dir"]), "--out",
                           str(tmp_path / "rl.png")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / "rl.png").stat().st_size > 10_000, done.stderr
    sys.path.insert(0, str(REPO / "toolkits"))
    try:
        import plot_rl
    finally:
        sys.path.remove(str(REPO / "toolkits"))
    curves = plot_rl.success_vs_episodes(plot_rl.joined_rl_scalars([straight_run["run_dir"]]))
    assert curves == {"rollout": ([2, 4], [0.0, 0.0])}
    bad = subprocess.run([sys.executable, str(REPO / "toolkits/plot_rl.py"), str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "not an RL run directory" in bad.stderr


def test_checkpoint_converts_and_evaluates(straight_run, tiny_model_and_stats, tmp_path: Path) -> None:
    """The RL checkpoint converts with the SFT converter and the converted model runs the eval launcher."""
    out = tmp_path / "converted"
    proc = subprocess.run([sys.executable, str(REPO / "toolkits/cosmos3/convert_checkpoint.py"), "--src",
                           str(straight_run["ckpts"]), "--base", str(tiny_model_and_stats.model), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "global_step_2" in proc.stderr  # the newest checkpoint
    from diffusers import Cosmos3OmniTransformer

    expected = load_full_weights(straight_run["ckpts"] / "global_step_2")
    loaded = Cosmos3OmniTransformer.from_pretrained(out / "transformer").state_dict()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)
    assert read_identity(out) == read_identity(straight_run["ckpts"] / "global_step_2")

    mark = os.urandom(6).hex()
    proc = subprocess.run(
        ["bash", str(REPO / "evaluations/run_eval.sh"), "libero", "libero_spatial_cosmos3_eval_tiny",
         f"rollout.model.model_path={out}", f"rollout.model.action_stats_path={tiny_model_and_stats.stats}",
         f"runner.logs_dir={tmp_path / 'eval_logs'}", "rollout.rollout_backend=embedded",
         "env.eval.max_episode_steps=26", "env.eval.save_video=none"],
        capture_output=True, text=True, timeout=1500, env={**os.environ, RUN_MARK: mark})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    _assert_nothing_left(mark)
    (eval_dir,) = list((tmp_path / "eval_logs").iterdir())
    summary = json.loads((eval_dir / "summary.json").read_text())
    assert summary["num_trajectories"] == 2 and summary["num_errors"] == 0


def test_resume_reproduces_the_straight_run_and_a_time_limit_stops_it(straight_run, tiny_model_and_stats,
                                                                     tmp_path: Path) -> None:
    """Resumed from ``global_step_1`` with a longer plan (``runner.max_iterations=5``, ``save_interval=5``; the
    learning rate is constant, so the plan's length changes nothing) and ``runner.max_wall_time_s``: it plays and
    trains iteration 2 exactly as the straight run did (rollout fingerprint, weights, optimizer, trainer state);
    the time limit then stops it after that iteration, saved although not on the save interval, and the run exits
    0 naming the checkpoint to continue from."""
    resumed = _launch(tiny_model_and_stats, tmp_path, f"runner.resume_dir={straight_run['ckpts'] / 'global_step_1'}",
                      "runner.max_iterations=5", "runner.save_interval=5", "runner.max_wall_time_s=0.001")
    log = (resumed["run_dir"] / "rl_embodiment.log").read_text()
    assert "resumed at iteration 1" in log and "iteration 1/5: rollout" not in log
    b = resumed["ckpts"] / "global_step_2"
    assert f"runner.max_wall_time_s=0.001 reached after iteration 2 of 5: stopped; continue with " \
           f"runner.resume_dir={b}" in log
    assert "iteration 3/5" not in log and [p.name for p in resumed["ckpts"].iterdir()] == ["global_step_2"]
    assert is_complete_checkpoint(b)
    straight_scalars, resumed_scalars = _scalars(straight_run["run_dir"]), _scalars(resumed["run_dir"])
    for name in FINGERPRINT:
        assert resumed_scalars[name] == {2: straight_scalars[name][2]}, name
    a = straight_run["ckpts"] / "global_step_2"
    _assert_same_weights(a, b)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    states = []
    for index, step in enumerate((a, b)):
        dcp_to_torch_save(actor_dir(step) / "dcp", tmp_path / f"resume_state_{index}.pt")
        states.append(torch.load(tmp_path / f"resume_state_{index}.pt", weights_only=False))
    assert states[0]["optimizer"]["param_groups"] == states[1]["optimizer"]["param_groups"]
    assert states[0]["optimizer"]["state"].keys() == states[1]["optimizer"]["state"].keys()
    assert TrainerState.read(actor_dir(a) / TRAINER_STATE_FILE) == TrainerState.read(actor_dir(b) / TRAINER_STATE_FILE)


def test_sigterm_leaves_nothing_running(tiny_model_and_stats, tmp_path: Path) -> None:
    """SIGTERM to the driver during the first rollout: Ray, the actor, the env workers and the simulators all go."""
    mark = os.urandom(6).hex()
    out_file = tmp_path / "out.txt"
    with open(out_file, "w") as out:
        proc = subprocess.Popen(_command(tiny_model_and_stats, tmp_path, "runner.max_iterations=5"), cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, RUN_MARK: mark})
    deadline = time.monotonic() + 600
    while "iteration 1/5: rollout" not in out_file.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, out_file.read_text()[-3000:]
        time.sleep(0.5)
    time.sleep(3.0)  # simulators started and stepping
    assert any("libero_server" in cmd for _, cmd in _marked(mark)), "no simulator was seen running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    _assert_nothing_left(mark)
    assert not (tmp_path / "ckpts" / "libero_rl_cosmos3_tiny" / "checkpoints" / "global_step_1").exists()


PPO_FINGERPRINT = FINGERPRINT + ("optimizer_steps", "update_decisions", "value_loss", "value_mean", "return_mean",
                                 "value_grad_norm", "bootstrapped_episodes")
"""Iteration metrics a resumed PPO run reproduces exactly: the rollout's, and the update's values and losses."""


@pytest.fixture(scope="module")
def ppo_run(tiny_model_and_stats, tmp_path_factory) -> dict:
    return _launch(tiny_model_and_stats, tmp_path_factory.mktemp("rl_ppo"), "algorithm.name=ppo")


def test_ppo_trains_the_value_head_and_converts_as_grpo(ppo_run, tiny_model_and_stats, tmp_path: Path) -> None:
    """2 PPO iterations: every decision is trained on (no group is dropped), the value loss is logged, each
    checkpoint holds the critic beside the model, and the converter turns it into the same diffusers transformer
    as for GRPO (the value head is not part of it)."""
    run_dir, ckpts = ppo_run["run_dir"], ppo_run["ckpts"]
    log = (run_dir / "rl_embodiment.log").read_text()
    assert "iteration 2/2: success" in log and "saved checkpoint" in log
    scalars = _scalars(run_dir)
    assert scalars["update_decisions"] == {1: 4.0, 2: 4.0}  # 2 episodes x 2 decisions, none dropped
    assert scalars["optimizer_steps"] == {1: 2.0, 2: 2.0}   # 2 epochs x one minibatch of 4
    for name in ("value_loss", "value_clip_fraction", "value_mean", "return_mean", "value_grad_norm"):
        assert sorted(scalars[name]) == [1, 2], name
    # every episode that ran to the cap bootstraps from the value of the observation it stopped at
    for i in (1, 2):
        truncated = scalars["episodes"][i] * (1.0 - scalars["success_rate"][i])
        assert scalars["bootstrapped_episodes"][i] == pytest.approx(truncated) and truncated > 0, i
    for step in ("global_step_1", "global_step_2"):
        assert is_complete_checkpoint(ckpts / step) and (ckpts / step / VALUE_HEAD_FILE).is_file()
    out = tmp_path / "converted"
    proc = subprocess.run([sys.executable, str(REPO / "toolkits/cosmos3/convert_checkpoint.py"), "--src",
                           str(ckpts / "global_step_2"), "--base", str(tiny_model_and_stats.model), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from diffusers import Cosmos3OmniTransformer

    expected = load_full_weights(ckpts / "global_step_2")
    loaded = Cosmos3OmniTransformer.from_pretrained(out / "transformer").state_dict()
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    assert not (out / VALUE_HEAD_FILE).exists()


def test_ppo_resume_continues_the_run(ppo_run, tiny_model_and_stats, tmp_path: Path) -> None:
    """A PPO run resumed from ``global_step_1`` loads the critic and plays and trains iteration 2 exactly as the
    straight run did: its starts, episodes and decisions, the values, returns and losses, and the weights, the value
    head and the trainer state it saves. Each round seeds its simulators' resets (``rl/rounds.round_reset_seeds``),
    so the resumed run's fresh simulators begin in the scenes the straight run's kept ones did."""
    resumed = _launch(tiny_model_and_stats, tmp_path, "algorithm.name=ppo",
                      f"runner.resume_dir={ppo_run['ckpts'] / 'global_step_1'}")
    log = (resumed["run_dir"] / "rl_embodiment.log").read_text()
    assert "value head" in log and "resumed at iteration 1" in log
    straight_scalars, resumed_scalars = _scalars(ppo_run["run_dir"]), _scalars(resumed["run_dir"])
    for name in PPO_FINGERPRINT:
        assert resumed_scalars[name] == {2: straight_scalars[name][2]}, name
    a, b = ppo_run["ckpts"] / "global_step_2", resumed["ckpts"] / "global_step_2"
    _assert_same_weights(a, b)
    head_a, head_b = (state_from_text((step / VALUE_HEAD_FILE).read_text()) for step in (a, b))
    assert head_a["head"].keys() == head_b["head"].keys()
    assert all(torch.equal(head_a["head"][k], head_b["head"][k]) for k in head_a["head"])
    moments_a, moments_b = head_a["optimizer"]["state"], head_b["optimizer"]["state"]
    assert moments_a.keys() == moments_b.keys()
    assert all(torch.equal(moments_a[i][k], moments_b[i][k]) for i in moments_a for k in moments_a[i])
    assert TrainerState.read(actor_dir(a) / TRAINER_STATE_FILE) == TrainerState.read(actor_dir(b) / TRAINER_STATE_FILE)
