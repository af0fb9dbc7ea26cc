"""PipelinedEvalRunner in-process: real Ray, real LIBERO env workers, the real embedded diffusers
backend (a tiny random Cosmos3; no SGLang start-up, which takes minutes on CPU).

Backend ownership: a backend handed to ``run`` is used and left running (a second run, or any
caller, can keep using it); one the runner makes itself is stopped when the run ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray

from rlinf_cosmos3.actions import write_action_stats
from rlinf_cosmos3.cluster import Cluster, ClusterConfig
from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.runners.eval_runner import PipelinedEvalRunner
from rlinf_cosmos3.validation.eval import load_eval_config
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.factory import make_backend

pytestmark = [pytest.mark.slow, pytest.mark.libero]

CAP = 26  # 10 settle steps + one chunk of 16: one request per episode
EMBEDDED_GROUP = "EmbeddedPolicyGroup"  # the embedded backend's WorkerGroup (and placement group) name
Q01 = [-0.5, -1.0, 0.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, 0.0]
Q99 = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval_runner")
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": Q01, "max": Q99, "q01": Q01, "q99": Q99}
    stats = write_action_stats({"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block},
                               root / "stats.json")
    return {"model": write_model_dir(root / "tiny", preset="tiny", seed=0), "stats": stats}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp_dir = Path(f"/tmp/rer{os.getpid()}_{time.monotonic_ns() % 10**6}")  # Ray's socket paths must stay short
    c = Cluster(ClusterConfig(num_cpus=2, num_gpus=0, object_store_memory_mb=200, temp_dir=str(temp_dir)))
    try:
        yield c
    finally:
        c.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _cfg(files: dict[str, Path], stages: int, **env: object) -> EvalConfig:
    return load_eval_config({
        "env": {"eval": {"suite": "libero_spatial", "task_ids": [0], "trials_per_task": 2, "total_num_envs": 2,
                         "num_workers": 1, "max_episode_steps": CAP, "stop_on_success": False, **env}},
        "rollout": {"rollout_backend": "embedded", "pipeline_stage_num": stages,
                    "model": {"model_path": str(files["model"]), "action_stats_path": str(files["stats"]),
                              "action_normalization": "quantile_rot", "num_inference_steps": 2},
                    "embedded": {"num_workers": 1, "gpus_per_worker": 0, "batching_max_size": 2}},
    })


def _embedded_groups() -> list[str]:
    """States of the embedded backend's placement groups (``CREATED`` while it runs)."""
    return [pg["state"] for pg in ray.util.placement_group_table().values() if pg["name"] == EMBEDDED_GROUP]


def _check_run(run_dir: Path, summary_steps: int) -> None:
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["trial_id"], r["steps"], r["error"]) for r in results) == \
        [(0, 0, CAP, None), (0, 1, CAP, None)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_trajectories"] == 2 and summary["env_steps"] == summary_steps == 2 * CAP


def test_a_given_backend_is_used_and_left_running(model_files: dict[str, Path], cluster: Cluster,
                                                   tmp_path: Path) -> None:
    """Two stages, one env each, against a backend the test started: the run completes, and the
    backend still serves afterwards (the runner did not close it)."""
    cfg = _cfg(model_files, stages=2)
    with make_backend("embedded", cfg.rollout.model, embedded_cfg=cfg.rollout.embedded, log_dir=tmp_path,
                      cluster=cluster) as backend:
        summary = PipelinedEvalRunner(cfg, tmp_path).run(cluster, backend=backend)
        _check_run(tmp_path, summary.env_steps)
        assert summary.chunk_requests == 2 and summary.wall_time_s > 0
        # each of the 2 stage loops waited on one request and one chunk step, inside the wall time
        assert summary.inference_wait_s > 0 and summary.sim_wait_s > 0
        assert summary.inference_wait_s + summary.sim_wait_s <= 2 * summary.wall_time_s
        assert _embedded_groups().count("CREATED") == 1, "the runner must not close a backend it was given"
        adapter = Cosmos3ActionAdapter(cfg.rollout.model, 2)
        rng = np.random.default_rng(0)
        obs = {"main_images": rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8),
               "wrist_images": rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8),
               "task_descriptions": ["pick up the black bowl"]}
        actions = asyncio.run(adapter.predict(obs, backend))
        assert actions.shape == (1, 16, 7) and np.isfinite(actions).all()
    assert "CREATED" not in _embedded_groups()


def test_a_backend_the_runner_makes_is_closed_at_the_end_and_failures_have_named_videos(
        model_files: dict[str, Path], cluster: Cluster, tmp_path: Path) -> None:
    """The runner closes the backend it started. With save_video=failures the tiny random model fails
    both episodes, so both have an mp4 on disk, named by its results.jsonl row (relative to the run
    directory) and listed in summary.json; nothing else is left in the video directory (no partial
    file). A success's video being dropped is checked on a scripted success in test_env_worker.py."""
    cfg = _cfg(model_files, stages=1, save_video="failures", video_dir=str(tmp_path / "videos"))
    before = len(_embedded_groups())
    summary = PipelinedEvalRunner(cfg, tmp_path).run(cluster)
    _check_run(tmp_path, summary.env_steps)
    states = _embedded_groups()
    assert len(states) == before + 1, "the runner should have started its own backend"
    assert "CREATED" not in states, f"the runner's own backend is still up: {states}"
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "videos").rglob("*") if p.is_file())
    failed = sorted(r["video"] for r in rows if not r["success_once"])
    assert all((r["video"] is None) == r["success_once"] for r in rows), rows
    assert on_disk == failed and len(on_disk) == sum(not r["success_once"] for r in rows)
    assert all(v.endswith("_failure.mp4") and (tmp_path / v).stat().st_size > 0 for v in on_disk)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["save_video"] == "failures" and sorted(saved["videos"]) == on_disk
