"""The ``replay`` rollout backend: recorded actions through the whole eval path, no model.

Config checks run on a hand-written ``meta/episodes`` table (fast). The end-to-end test records two
scripted libero_spatial demonstrations with the real simulator (the session's
``recorded_libero_dataset``), computes stats from them as the SFT toolkit does, and runs the real
eval (Ray, env workers, adapter) with the replay backend: every demonstration that succeeded when
recorded succeeds again. The negative control encodes with another stats file than the eval
de-normalises with (a wrong-stats convention error): the same demonstrations then fail.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlinf_cosmos3.actions import (
    ActionNormalizer,
    compute_action_stats,
    encode_model_actions,
    read_lerobot_episode_actions,
    write_action_stats,
)
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.validation.eval import load_eval_config
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.protocol import EPISODE_CONTEXT
from rlinf_cosmos3.workers.rollout.replay import ReplayBackend

SETTLE = 10


def _stats(path: Path, scale: float = 1.0) -> Path:
    q01 = [-0.5, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 0.0]
    q99 = [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": q01, "max": q99,
             "q01": [q * scale for q in q01], "q99": [q * scale for q in q99]}
    return write_action_stats({"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block},
                              path)


def _fake_dataset(root: Path, pairs: list[tuple[int, int]], settle: int = SETTLE) -> Path:
    (root / "meta" / "episodes").mkdir(parents=True)
    (root / "meta" / "info.json").write_text("{}")
    table = pa.table({"episode_index": list(range(len(pairs))), "task_id": [t for t, _ in pairs],
                      "init_state_id": [i for _, i in pairs], "suite": ["libero_spatial"] * len(pairs),
                      "success": [True] * len(pairs), "num_settle_steps": [settle] * len(pairs)})
    pq.write_table(table, root / "meta" / "episodes" / "file-000.parquet")
    return root


def _cfg(dataset: Path, stats: Path, init_states: list[int], replay_stats: Path | None = None,
         **env: object) -> EvalConfig:
    return load_eval_config({
        "env": {"eval": {"suite": "libero_spatial", "task_ids": [0], "init_state_ids": init_states,
                         "total_num_envs": len(init_states), "num_workers": 1, "num_settle_steps": SETTLE, **env}},
        "rollout": {"rollout_backend": "replay", "pipeline_stage_num": 1,
                    "model": {"action_stats_path": str(stats), "action_normalization": "quantile_rot"},
                    "replay": {"dataset_root": str(dataset),
                               "stats_path": None if replay_stats is None else str(replay_stats)}},
    })


def test_config_accepts_recorded_pairs_without_a_model(tmp_path: Path) -> None:
    cfg = _cfg(_fake_dataset(tmp_path / "ds", [(0, 0), (0, 1)]), _stats(tmp_path / "s.json"), [0, 1])
    assert cfg.rollout.batching_max_size == cfg.rollout.replay.batching_max_size


def test_config_names_a_missing_episode(tmp_path: Path) -> None:
    dataset, stats = _fake_dataset(tmp_path / "ds", [(0, 0)]), _stats(tmp_path / "s.json")
    with pytest.raises(ConfigError, match=r"no recorded episode for \(task, init state\) \[\(0, 3\)\]") as err:
        _cfg(dataset, stats, [0, 3])
    assert err.value.field == "rollout.replay.dataset_root" and "init_state_ids" in (err.value.fix or "")


def test_config_rejects_other_settle_steps_and_a_missing_dataset(tmp_path: Path) -> None:
    stats = _stats(tmp_path / "s.json")
    with pytest.raises(ConfigError) as err:
        _cfg(_fake_dataset(tmp_path / "ds", [(0, 0)], settle=5), stats, [0])
    assert err.value.field == "env.eval.num_settle_steps"
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path / "nowhere", stats, [0])
    assert err.value.field == "rollout.replay.dataset_root"


def test_adapter_sends_each_rows_episode_and_decodes_the_recorded_actions(tmp_path: Path) -> None:
    """Rows out of order and a step past the end: each gets its own episode's actions, the last repeated."""
    stats = _stats(tmp_path / "s.json")
    cfg = _cfg(_fake_dataset(tmp_path / "ds", [(0, 0), (0, 1)]), stats, [0, 1])
    backend = ReplayBackend(cfg.rollout.model, cfg.rollout.replay)
    rng = np.random.default_rng(0)
    recorded = {pair: np.concatenate([rng.uniform(-0.3, 0.3, (20, 6)), rng.integers(0, 2, (20, 1))], axis=1)
                for pair in [(0, 0), (0, 1)]}
    normalizer = ActionNormalizer(str(stats), "quantile_rot")
    backend._encoded = {p: encode_model_actions(a, normalizer)[0] for p, a in recorded.items()}  # as start() does
    adapter = Cosmos3ActionAdapter(cfg.rollout.model, 8)
    obs = {"main_images": np.zeros((2, 64, 64, 3), np.uint8), "wrist_images": np.zeros((2, 64, 64, 3), np.uint8),
           "task_descriptions": ["a", "b"], "task_ids": np.array([0, 0]), "trial_ids": np.array([1, 0]),
           "episode_steps": np.array([16, 0])}
    out = asyncio.run(adapter.predict(obs, backend))
    np.testing.assert_allclose(out[1, :, :6], recorded[(0, 0)][:16, :6], atol=1e-5)
    np.testing.assert_allclose(out[0, :4, :6], recorded[(0, 1)][16:, :6], atol=1e-5)
    np.testing.assert_allclose(out[0, 4:, :6], np.repeat(recorded[(0, 1)][-1:, :6], 12, axis=0), atol=1e-5)
    [group] = adapter.request_groups(obs, by_prompt_length=False)
    assert EPISODE_CONTEXT not in adapter.build_request(group), "a model backend's payload must stay unchanged"
    assert adapter.build_request(group, with_episode=True)[EPISODE_CONTEXT]["steps"] == [16, 0]
    # stored gripper 1 = open -> LIBERO -1
    np.testing.assert_array_equal(out[1, :, 6], np.where(recorded[(0, 0)][:16, 6] > 0.5, -1.0, 1.0))


@pytest.mark.slow
@pytest.mark.libero
def test_recorded_successes_are_reproduced_and_wrong_stats_fail(recorded_libero_dataset, tmp_path: Path) -> None:
    from rlinf_cosmos3.cluster import Cluster, ClusterConfig
    from rlinf_cosmos3.runners.eval_runner import PipelinedEvalRunner

    data = recorded_libero_dataset
    succeeded = sorted(r.init_state_id for r in data.results if r.success and r.episode_index is not None)
    assert succeeded, f"the scripted policy failed every recording: {data.results}"
    actions = read_lerobot_episode_actions(data.root)
    stats = write_action_stats(compute_action_stats(actions.episodes, metadata={"fps": data.fps}),
                               tmp_path / "stats.json")
    wrong = compute_action_stats(actions.episodes, metadata={"fps": data.fps})
    for block in ("global", "global_raw"):  # translation range doubled: a model trained on other stats
        wrong[block]["q01"][:3] = [2 * q for q in wrong[block]["q01"][:3]]
        wrong[block]["q99"][:3] = [2 * q for q in wrong[block]["q99"][:3]]
    wrong_stats = write_action_stats(wrong, tmp_path / "wrong_stats.json")
    longest = max(len(a) for a in actions.episodes)
    cap = SETTLE + longest + 16
    temp_dir = Path(f"/tmp/rrp{os.getpid()}_{time.monotonic_ns() % 10**6}")  # Ray's socket paths must stay short
    cluster = Cluster(ClusterConfig(num_cpus=2, num_gpus=0, object_store_memory_mb=200, temp_dir=str(temp_dir)))
    try:
        for name, replay_stats, expect in (("right", None, True), ("wrong", wrong_stats, False)):
            cfg = _cfg(data.root, stats, succeeded, replay_stats, max_episode_steps=cap)
            run_dir = tmp_path / name
            run_dir.mkdir()
            summary = PipelinedEvalRunner(cfg, run_dir).run(cluster)
            assert summary.num_errors == 0 and summary.num_trajectories == len(succeeded)
            assert summary.success_once == (1.0 if expect else 0.0), (name, summary.to_dict())
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
