"""The stats toolkit on a real LeRobot v3 dataset written with lerobot's own writer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlinf_cosmos3.actions import STAT_FIELDS, STATS_FILENAME, actions_7_to_10, read_lerobot_episode_actions
from rlinf_cosmos3.paths import REPO_ROOT

TOOLKIT = REPO_ROOT / "toolkits" / "cosmos3" / "compute_action_stats.py"
EPISODE_LENGTHS = (20, 35, 16)  # the last one is too short for a 16-step chunk (needs 17 frames)
FPS = 20


def _known_actions(length: int, seed: int) -> np.ndarray:
    """Per-step deltas like LIBERO's: small translations and rotations, gripper stored as g in {0, 1}."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(-0.9, 0.9, size=(length, 3))
    rot = rng.normal(scale=0.1, size=(length, 3))
    grip = (np.arange(length) < length // 2).astype(np.float64)[:, None]  # open, then closed
    return np.concatenate([pos, rot, grip], axis=1).astype(np.float32)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path_factory.mktemp("lerobot") / "libero_tiny"
    features = {
        "action": {"dtype": "float32", "shape": (7,), "names": ["x", "y", "z", "rx", "ry", "rz", "gripper"]},
        "observation.state": {"dtype": "float32", "shape": (8,), "names": None},
    }
    ds = LeRobotDataset.create("local/libero_tiny", fps=FPS, features=features, root=root, use_videos=False)
    episodes = [_known_actions(n, seed) for seed, n in enumerate(EPISODE_LENGTHS)]
    for ep in episodes:
        for row in ep:
            ds.add_frame(
                {"action": row, "observation.state": np.zeros(8, np.float32), "task": "pick up the bowl"}
            )
        ds.save_episode()
    ds.finalize()
    return root, episodes


def _expected(episodes: list[np.ndarray], chunk_length: int) -> dict[str, np.ndarray]:
    """Independent recomputation: stack every training chunk, numpy statistics."""
    rows = np.concatenate(
        [
            actions_7_to_10(ep.astype(np.float64)[t : t + chunk_length])
            for ep in episodes
            for t in range(len(ep) - chunk_length)
        ]
    )
    return {
        "mean": rows.mean(0),
        "std": rows.std(0, ddof=1),
        "min": rows.min(0),
        "max": rows.max(0),
        "q01": np.quantile(rows, 0.01, axis=0),
        "q99": np.quantile(rows, 0.99, axis=0),
    }


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOLKIT), *args], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )


def test_reader_returns_episodes_in_order(dataset) -> None:
    root, episodes = dataset
    data = read_lerobot_episode_actions(root)
    assert data.fps == FPS
    assert data.episode_indices == [0, 1, 2]
    for got, want in zip(data.episodes, episodes, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_toolkit_writes_the_stats_of_the_dataset(dataset, tmp_path) -> None:
    root, episodes = dataset
    out = tmp_path / "stats.json"
    proc = _run("--data", str(root), "--out", str(out), "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    assert "23 of 23 chunks" in proc.stdout and str(out) in proc.stdout
    stats = json.loads(out.read_text())
    expected = _expected(episodes, 16)
    for field in STAT_FIELDS:
        np.testing.assert_allclose(
            stats["global_raw"][field], expected[field], rtol=1e-9, atol=1e-9, err_msg=field
        )
        assert stats["global"][field][:3] == stats["global_raw"][field][:3]
    assert stats["global"]["q01"][3:9] == [-1.0] * 6 and stats["global"]["q99"][3:9] == [1.0] * 6
    # Hand facts: translation was drawn in [-0.9, 0.9]; gripper is 0/1 so its q01/q99 are 0 and 1.
    assert -0.9 <= stats["global_raw"]["min"][0] and stats["global_raw"]["max"][0] <= 0.9
    assert (stats["global_raw"]["q01"][9], stats["global_raw"]["q99"][9]) == (0.0, 1.0)
    meta = stats["metadata"]
    assert meta["fps"] == FPS
    assert Path(meta["dataset_root"]) == root.resolve()
    assert (meta["num_episodes"], meta["num_frames"], meta["num_chunks"]) == (3, sum(EPISODE_LENGTHS), 4 + 19)
    assert (meta["chunk_length"], meta["rotation_format"], meta["normalization"], meta["seed"]) == (
        16,
        "rot6d",
        "quantile_rot",
        7,
    )


@pytest.mark.slow
def test_toolkit_chunk_length_subset_and_directory_output(dataset, tmp_path) -> None:
    root, episodes = dataset
    proc = _run("--data", str(root), "--out", str(tmp_path), "--chunk-length", "8", "--max-samples", "10")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((tmp_path / STATS_FILENAME).read_text())
    meta = stats["metadata"]
    assert (meta["chunk_length"], meta["num_chunks"], meta["num_chunks_available"]) == (8, 10, 12 + 27 + 8)
    assert meta["num_rows_stats"] == 80
    full = _expected(episodes, 8)
    assert all(lo >= f for lo, f in zip(stats["global_raw"]["min"], full["min"], strict=True))
    assert all(hi <= f for hi, f in zip(stats["global_raw"]["max"], full["max"], strict=True))


def test_toolkit_rejects_a_folder_that_is_not_a_dataset(tmp_path) -> None:
    proc = _run("--data", str(tmp_path), "--out", str(tmp_path / "s.json"))
    assert proc.returncode == 2
    assert "no meta/info.json" in proc.stdout + proc.stderr
    assert not (tmp_path / "s.json").exists()
