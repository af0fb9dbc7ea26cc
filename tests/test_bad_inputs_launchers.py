"""The launchers as a user runs them: a bad command line exits with code 2 and one line naming the key, and
an evaluation that fails after it started Ray and simulators leaves no process behind.

Real ``bash examples/sft/run_vla_sft.sh`` / ``bash evaluations/run_eval.sh`` subprocesses on real inputs
(tiny Cosmos3 directory, stats file, LeRobot v3 dataset; the real simulator and SGLang environments).
Every process a launcher starts inherits a run mark in its environment, so the leftover check sees
this run's processes only. The table in docs/reliability.md names these tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats

REPO = Path(__file__).resolve().parent.parent
RUN_MARK = "RLINF_COSMOS3_TEST_RUN"
LEFTOVER_PATTERNS = ("rlinf_cosmos3.sim.libero_server", "sglang", "sgl_diffusion", "raylet", "gcs_server", "ray::")


@pytest.fixture(scope="module")
def inputs(recorded_libero_dataset, tmp_path_factory) -> dict[str, Path]:
    """A tiny model, the session's recorded dataset and stats computed on it."""
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

    root = tmp_path_factory.mktemp("bad_launchers")
    episodes = read_lerobot_episode_actions(recorded_libero_dataset.root).episodes
    stats = compute_action_stats(episodes, metadata={"fps": recorded_libero_dataset.fps})
    return {"root": root, "model": write_model_dir(root / "model", preset="tiny", seed=0),
            "stats": write_action_stats(stats, root / "stats.json"), "data": recorded_libero_dataset.root}


def _marked(mark: str) -> list[str]:
    """Command lines of live processes whose environment carries ``RUN_MARK=mark``."""
    needle, out = f"{RUN_MARK}={mark}".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            out.append(cmd)
    return out


def _launch(script: str, *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a launcher; assert that nothing it started is still alive afterwards."""
    mark = os.urandom(6).hex()
    proc = subprocess.run(["bash", str(REPO / script), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), RUN_MARK: mark})
    deadline = time.monotonic() + 30  # process groups are reaped asynchronously after exit
    while (left := [c for c in _marked(mark) if any(p in c for p in LEFTOVER_PATTERNS)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left behind: {left}"
    return proc


def test_launchers_without_a_known_config_print_their_usage(tmp_path) -> None:
    for script, args, text in [
        ("examples/sft/run_vla_sft.sh", [], "usage:"),
        ("examples/sft/run_vla_sft.sh", ["libero_sft_cosmos3_tni"], "no config 'libero_sft_cosmos3_tni'"),
        ("evaluations/run_eval.sh", ["libero"], "usage:"),
        ("evaluations/run_eval.sh", ["metaworld", "libero_spatial_cosmos3_eval_tiny"], "usage:"),
        ("evaluations/run_eval.sh", ["libero", "nope"], "no config 'nope' in evaluations/libero/"),
    ]:
        proc = _launch(script, *args, cwd=tmp_path)
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr
        assert "libero_spatial_cosmos3_eval_tiny" in proc.stderr or "libero_sft_cosmos3_tiny" in proc.stderr


@pytest.mark.slow
def test_an_unknown_key_on_the_command_line_is_a_config_error(inputs, tmp_path) -> None:
    sft = [f"actor.model.model_path={inputs['model']}", f"data.dataset.root={inputs['data']}",
           f"data.dataset.stats_path={inputs['stats']}", f"runner.logs_dir={tmp_path / 'logs'}",
           f"runner.log_path={tmp_path / 'ckpts'}"]
    proc = _launch("examples/sft/run_vla_sft.sh", "libero_sft_cosmos3_tiny", *sft, "foo.bar=1", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "invalid config: config field 'foo.bar': unknown key (Key 'foo' not in 'SFTConfig')" in out
    assert "Traceback" not in out and "+foo.bar=1" not in out and not (tmp_path / "ckpts").exists()

    # An added key (+foo.bar=1) composes and is refused by the schema: run_sft in test_bad_inputs_sft.py.

    evaluation = [f"rollout.model.model_path={inputs['model']}", f"rollout.model.action_stats_path={inputs['stats']}",
                  f"runner.logs_dir={tmp_path / 'eval_logs'}"]
    proc = _launch("evaluations/run_eval.sh", "libero", "libero_spatial_cosmos3_eval_tiny", *evaluation,
                   "env.eval.num_envs=2", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "invalid config: config field 'env.eval.num_envs': unknown key" in out and "env.eval.total_num_envs" in out


@pytest.mark.slow
def test_ranks_that_do_not_fit_the_machine_exit_2_without_a_traceback(inputs, tmp_path) -> None:
    """The cluster's size is known only once Ray runs: a rank wanting more CPUs than any node has is still a
    config error (exit 2, the field and the fix in one line), and Ray is stopped."""
    proc = _launch("examples/sft/run_vla_sft.sh", "libero_sft_cosmos3_tiny", f"actor.model.model_path={inputs['model']}",
                   f"data.dataset.root={inputs['data']}", f"data.dataset.stats_path={inputs['stats']}",
                   f"data.latent_cache_dir={tmp_path / 'latents'}", f"runner.logs_dir={tmp_path / 'logs'}",
                   f"runner.log_path={tmp_path / 'ckpts'}", "cluster.cpus_per_rank=100000", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "the ranks do not fit this cluster: config field 'cluster.num_cpu_ranks_per_node'" in out
    assert "rank(s) = {CPU: " in out and "a smaller cluster.cpus_per_rank" in out
    assert "Traceback" not in out and not (tmp_path / "ckpts").exists()


@pytest.mark.slow
@pytest.mark.libero
@pytest.mark.sglang
def test_an_eval_whose_server_cannot_start_stops_ray_and_the_simulators(inputs, tmp_path) -> None:
    proc = _launch("evaluations/run_eval.sh", "libero", "libero_spatial_cosmos3_eval_tiny",
                   f"rollout.model.model_path={inputs['model']}", f"rollout.model.action_stats_path={inputs['stats']}",
                   f"runner.logs_dir={tmp_path / 'logs'}", "env.eval.total_num_envs=1", "env.eval.trials_per_task=1",
                   "rollout.pipeline_stage_num=1", "env.eval.save_video=false",
                   "rollout.sglang.extra_server_args=[--no-such-server-flag]", cwd=tmp_path, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs").iterdir()
    log = (run_dir / "eval_embodiment.log").read_text()
    assert "env workers ready" in log  # it got as far as Ray and a running simulator
    assert "the rollout backend did not start" in log and "--no-such-server-flag" in log
    assert "Traceback" not in proc.stderr


def test_python_may_be_named_by_command_and_a_missing_one_is_refused(tmp_path) -> None:
    """``PYTHON=python3`` (a name on PATH, as on a machine without the project's venvs) runs the launcher;
    a name that is nowhere stops it before anything starts, saying what to do."""
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    for script, config in (("examples/sft/run_vla_sft.sh", ["libero_sft_cosmos3_tiny"]),
                           ("evaluations/run_eval.sh", ["libero", "libero_spatial_cosmos3_eval_tiny"])):
        ran = subprocess.run(["bash", str(REPO / script), *config, "foo.bar=1"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, env={**env, "PYTHON": Path(sys.executable).name})
        assert ran.returncode == 2 and "unknown key" in ran.stdout + ran.stderr, ran.stdout + ran.stderr
        missing = subprocess.run(["bash", str(REPO / script), *config], cwd=tmp_path, capture_output=True, text=True,
                                 timeout=60, env={**env, "PYTHON": "no-such-python3"})
        assert missing.returncode == 1, missing.stderr
        assert "no no-such-python3: run 'bash requirements/install.sh' first" in missing.stderr
