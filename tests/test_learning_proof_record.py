"""``benchmarks/gpu/learning_proof.sh``'s record phase with its defaults, on the real simulator.

The defaults are the data of the run that met the learning proof's targets: the training init states only,
two demonstrations each with their own grasp approach and place point. ``LP_TRAIN_STATES`` is a list of
init-state ids, and the recorder reads a lone integer N as "the first N" - so a single training state must
reach it as an id (``3`` must record init state 3, not 0, 1 and 2).
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from rlinf_cosmos3.actions import read_lerobot_episode_actions
from rlinf_cosmos3.paths import REPO_ROOT


@pytest.mark.slow
def test_record_phase_records_two_varied_demonstrations_of_each_training_state(tmp_path) -> None:
    """Two tasks (``LP_TASK="0,1"``, one model for several tasks), one training state: four episodes, all solved.
    The two demonstrations of a state differ from the approach on (``--approach-jitter``: each comes down onto the
    object from its own point) and both still grasp it: the lift raises it, the simulator's check passes."""
    work = tmp_path / "lp"
    env = {**os.environ, "LP_TASK": "0,1", "LP_TRAIN_STATES": "3", "LP_RECORD_ENVS": "2"}
    env.pop("LP_RECORD_ARGS", None)
    proc = subprocess.run(["bash", "benchmarks/gpu/learning_proof.sh", str(work), "record"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "--approach-jitter 0.03" in out  # the log says which data it records
    episodes = LeRobotDataset("local/learning_proof", root=work / "demos").meta.episodes
    assert list(episodes["init_state_id"]) == [3, 3, 3, 3]
    assert sorted(zip(episodes["task_id"], episodes["repeat"], strict=True)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert list(episodes["success"]) == [True] * 4
    actions = read_lerobot_episode_actions(work / "demos", repo_id="local/learning_proof")
    by_task: dict[int, list[np.ndarray]] = {}
    for index, task in zip(episodes["episode_index"], episodes["task_id"], strict=True):
        by_task.setdefault(int(task), []).append(actions.episodes[actions.episode_indices.index(int(index))])
    for task, (a, b) in by_task.items():
        n = min(len(a), len(b))
        first_diff = int(np.flatnonzero(np.abs(a[:n] - b[:n]).max(axis=1) > 1e-6)[0])
        grip_closed = min(int(np.flatnonzero(x[:, 6] == 0.0)[0]) for x in (a, b))  # the stored gripper: 0 = closed
        assert first_diff < grip_closed, f"task {task}: the approaches do not differ before the grasp"
    summary = json.loads((work / "record_summary.json").read_text())
    assert [e["init_state_id"] for e in summary["episodes"]] == [3] * 4
