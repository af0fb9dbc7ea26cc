"""Instruction swap and ablation (issue #31) with the real LIBERO simulator and the real eval path.

libero_goal's tasks share one kitchen, so task 8's init state loads into task 1's env. The bridge test
checks that the swapped reset is task 8's scene under task 1's goal. The eval test records one scripted
demonstration of task 8 ("put the bowl on the plate") and replays it (no model) through the whole eval:
under task 8 it succeeds; as task 1 ("put the bowl on the stove") started from task 8's init state it
grasps and moves the same bowl (the scene is task 8's) but fails task 1's goal; under an instruction
ablation task 8 still succeeds (the replay ignores the text) and the rows record the text sent.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.sim.client import LiberoSimProcess
from rlinf_cosmos3.validation.eval import load_eval_config

pytestmark = pytest.mark.libero

SUITE = "libero_goal"
PLATE, STOVE = 8, 1  # "put the bowl on the plate", "put the bowl on the stove": both move the bowl
BOWL = "akita_black_bowl_1"
SETTLE = 10


def _scene(reply: dict) -> dict[str, np.ndarray]:
    """The poses of the movable objects: what an init state sets. LIBERO places the fixtures (cabinet,
    stove, rack) anew on every reset, same task or not, so they are no part of it."""
    return {name: np.asarray(reply[f"pose/{name}"]) for name, kind in reply["entities"].items() if kind == "object"}


def test_a_swapped_reset_is_the_other_tasks_scene_under_the_built_tasks_goal() -> None:
    with LiberoSimProcess(name="goal-swap") as proc:
        proc.make(SUITE, PLATE, seed=0)
        plate_scene = _scene(proc.reset(0, privileged=True))
        proc.make(SUITE, STOVE, seed=0)
        own = proc.reset(0, privileged=True)
        swapped = proc.reset(0, privileged=True, init_state_task_id=PLATE)
    assert swapped["task"] == own["task"] == "put the bowl on the stove"
    assert swapped["goal"] == own["goal"] and "flat_stove_1_cook_region" in swapped["goal"][0]
    assert set(_scene(swapped)) == set(plate_scene)
    for name, pose in _scene(swapped).items():
        np.testing.assert_allclose(pose, plate_scene[name], atol=1e-6, err_msg=name)
    assert BOWL in plate_scene and np.abs(_scene(own)[BOWL][:3] - plate_scene[BOWL][:3]).max() > 1e-3, \
        "task 1's own init state 0 should place the bowl elsewhere, else this test proves nothing"


def _cfg(dataset: Path, stats: Path, task_ids: list[int], cap: int, **env: object):
    return load_eval_config({
        "env": {"eval": {"suite": SUITE, "task_ids": task_ids, "init_state_ids": [0], "total_num_envs": len(task_ids),
                         "num_workers": 1, "num_settle_steps": SETTLE, "max_episode_steps": cap, **env}},
        "rollout": {"rollout_backend": "replay", "pipeline_stage_num": 1,
                    "model": {"action_stats_path": str(stats), "action_normalization": "quantile_rot"},
                    "replay": {"dataset_root": str(dataset)}},
    })


def _rows(run_dir: Path) -> dict[int, dict]:
    return {r["task_id"]: r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_a_replayed_demo_succeeds_under_its_own_goal_and_fails_another_tasks_goal(tmp_path: Path, caplog) -> None:
    from rlinf_cosmos3.cluster import Cluster, ClusterConfig
    from rlinf_cosmos3.demos.recorder import RecordConfig, record_demos
    from rlinf_cosmos3.runners.eval_runner import PipelinedEvalRunner

    record = RecordConfig(suite=SUITE, task_ids=[PLATE], init_state_ids=[0], out=tmp_path / "dataset",
                          repo_id="local/goal_plate", num_envs=1)
    [recorded] = record_demos(record, show_progress=False)
    assert recorded.success, f"the scripted policy failed to record task {PLATE}: {recorded}"
    actions = read_lerobot_episode_actions(record.out)
    stats = write_action_stats(compute_action_stats(actions.episodes, metadata={"fps": record.fps}),
                               tmp_path / "stats.json")
    cap = SETTLE + len(actions.episodes[0]) + 16
    swap = _cfg(record.out, stats, [PLATE, STOVE], cap, init_states_from_task={STOVE: PLATE})
    ablated = _cfg(record.out, stats, [PLATE], cap, instruction_override="")
    temp_dir = Path(f"/tmp/swp{os.getpid()}_{time.monotonic_ns() % 10**6}")  # Ray's socket paths must stay short
    caplog.set_level("INFO", logger="rlinf_cosmos3.eval")
    cluster = Cluster(ClusterConfig(num_cpus=2, num_gpus=0, object_store_memory_mb=200, temp_dir=str(temp_dir)))
    try:
        for name, cfg in (("swap", swap), ("ablated", ablated)):
            (tmp_path / name).mkdir()
            summary = PipelinedEvalRunner(cfg, tmp_path / name).run(cluster)
            assert summary.num_errors == 0, summary.to_dict()
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)

    rows = _rows(tmp_path / "swap")
    own, other = rows[PLATE], rows[STOVE]
    assert own["success_once"] is True and own["init_state_task_id"] == PLATE
    assert own["instruction"] == own["task_description"] == "put the bowl on the plate"
    # task 1 from task 8's init state: the demo grasps and lifts the very bowl (the scene is task 8's) ...
    assert other["init_state_task_id"] == PLATE and other["object_lift_m"][BOWL] > 0.03, other
    # ... and puts it on the plate, which is not task 1's goal
    assert other["success_once"] is False and other["steps"] == cap
    assert other["instruction"] == other["task_description"] == "put the bowl on the stove"
    summary = json.loads((tmp_path / "swap" / "summary.json").read_text())
    assert summary["init_states_from_task"] == {str(STOVE): PLATE} and summary["instruction_override"] is None
    assert summary["per_task"][str(STOVE)]["init_state_task_id"] == PLATE
    assert summary["per_task"][str(PLATE)]["init_state_task_id"] == PLATE
    assert "instruction swap: task 1 from task 8's init states" in caplog.text
    assert "libero_goal  1 from task 8's init states: put the bowl" in caplog.text  # the printed table's row
    assert "instruction ablation: every request carried ''" in caplog.text

    [row] = _rows(tmp_path / "ablated").values()
    assert row["success_once"] is True and row["instruction"] == "" and row["task_description"] == "put the bowl on the plate"
    assert json.loads((tmp_path / "ablated" / "summary.json").read_text())["instruction_override"] == ""
