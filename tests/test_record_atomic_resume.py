"""A recording appears at --out only complete, and an interrupted one continues where it stopped.

Real simulator, real lerobot writer and aggregation, real SIGKILLs of the recorder's whole process group
(what a time limit or a lost machine does), including one while the dataset is being joined."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.demos.episode_store import EpisodeStore, partial_dir, publish_dataset, write_episode
from rlinf_cosmos3.demos.lerobot_writer import (
    ACTION_KEY,
    MAIN_IMAGE_KEY,
    STATE_KEY,
    WRIST_IMAGE_KEY,
    DemoDatasetWriter,
    EpisodeRecord,
)
from rlinf_cosmos3.demos.record_config import RecordConfig
from rlinf_cosmos3.paths import REPO_ROOT

CLI = REPO_ROOT / "toolkits" / "libero" / "record_demos.py"


def _frames(seed: int, n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Smooth moving images (as a camera sees) with a seed-dependent offset, states and commands."""
    rng = np.random.default_rng(seed)
    base = (np.add.outer(np.arange(256), np.arange(256)) % 256).astype(np.uint8)
    frames = []
    for t in range(n):
        img = np.stack([np.roll(base, t + seed * 7, axis=c % 2) for c in range(3)], axis=-1)
        img[40 + t: 70 + t, 30 + seed: 90 + seed] = (200, 30 * seed % 256, 90)
        command = np.concatenate([rng.uniform(-1, 1, 6), [1.0 if t % 9 < 5 else -1.0]])
        frames.append((img, img[::-1].copy(), rng.normal(size=8).astype(np.float32), command))
    return frames


def test_joined_episodes_decode_to_the_frames_one_serial_writer_stores(tmp_path: Path) -> None:
    """Episodes written one per dataset (as the writer processes do) and joined equal one dataset written
    serially from the same frames: decoded video frames, states, actions, tasks, outcome columns."""
    episodes = [(_frames(s, n), f"task {s % 2}") for s, n in ((1, 23), (2, 31), (3, 17))]
    records = [EpisodeRecord(success=s != 2, success_once=True, suite="libero_goal", task_id=s % 2, init_state_id=s,
                             num_settle_steps=10) for s in (1, 2, 3)]
    serial = DemoDatasetWriter(tmp_path / "serial", "local/serial")
    for (frames, task), record in zip(episodes, records, strict=True):
        for main, wrist, state, command in frames:
            serial.add_frame(main, wrist, state, command, task)
        serial.save_episode(record)
    serial.finalize()

    parts = [str(tmp_path / "partial" / f"ep{i}") for i in range(3)]
    (tmp_path / "partial").mkdir()
    for root, (frames, task), record in zip(parts, episodes, records, strict=True):
        write_episode(root, "local/joined", 20, 256, True, frames, task, vars(record))
    publish_dataset(parts, {i: vars(r) for i, r in enumerate(records)}, str(tmp_path / "joined"), "local/joined",
                    20, 256, True, str(tmp_path / "partial"))
    assert not (tmp_path / "partial").exists()

    a = LeRobotDataset("local/serial", root=tmp_path / "serial", video_backend="pyav")
    b = LeRobotDataset("local/joined", root=tmp_path / "joined", video_backend="pyav")
    assert (a.num_episodes, a.num_frames) == (b.num_episodes, b.num_frames) == (3, 71)
    for column in ("success", "init_state_id", "task_id", "length"):
        assert list(a.meta.episodes[column]) == list(b.meta.episodes[column])
    for i in range(a.num_frames):
        x, y = a[i], b[i]
        assert x["task"] == y["task"] and int(x["episode_index"]) == int(y["episode_index"])
        for key in (STATE_KEY, ACTION_KEY, MAIN_IMAGE_KEY, WRIST_IMAGE_KEY):
            assert (x[key] == y[key]).all(), (i, key)
    for key in (STATE_KEY, ACTION_KEY):
        for stat in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(a.meta.stats[key][stat], b.meta.stats[key][stat], rtol=1e-5, atol=1e-6)


def test_a_recording_with_other_settings_is_not_continued(tmp_path: Path) -> None:
    cfg = RecordConfig(suite="libero_spatial", task_ids=[0], init_state_ids=[0, 1], out=tmp_path / "ds")
    EpisodeStore(cfg).open()
    assert (partial_dir(cfg.out) / "plan.json").exists() and not cfg.out.exists()
    # settings that do not change what is recorded may differ
    EpisodeStore(RecordConfig(suite="libero_spatial", task_ids=[0], init_state_ids=[0, 1], out=tmp_path / "ds",
                              num_envs=4, writer_procs=3)).open()
    other = RecordConfig(suite="libero_spatial", task_ids=[0], init_state_ids=[0, 1, 2], out=tmp_path / "ds")
    with pytest.raises(ConfigError, match="init_state_ids differ") as err:
        EpisodeStore(other).open()
    assert err.value.field == "out" and "delete" in err.value.fix


def _record(out: Path, states: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CLI), "--suite", "libero_spatial", "--task-ids", "0", "--init-states", states,
         "--max-steps", "6", "--settle-steps", "2", "--keep-failed", "--out", str(out), "--repo-id", "local/resumed",
         "--num-envs", "1", "--writers", "1", "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _kill_group_when(proc: subprocess.Popen, ready) -> list[str]:
    """SIGKILL the recorder's whole process group (simulators, writers) as soon as ``ready(lines)`` holds."""
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not ready(lines):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the recorder ended (or took too long) before the moment to kill it:\n"
                            + "".join(lines[-30:]))
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the group's last members may take a moment to go
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    reader.join(timeout=10)
    return lines


def _finish(out: Path, states: str) -> str:
    proc = _record(out, states)
    text, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, text[-3000:]
    return text


@pytest.mark.slow
def test_sigkill_while_recording_then_the_same_command_records_only_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    committed = partial_dir(out) / "episodes" / "000-000-000.json"  # episode 0 is on disk
    _kill_group_when(_record(out, "0-2"), lambda lines: committed.exists())
    assert not out.exists(), "a killed recording must not leave anything at --out"
    text = _finish(out, "0-2")
    assert "continuing the recording" in text and "init 0: " not in text.split("continuing the recording")[1], \
        "the finished episode was recorded again"
    ds = LeRobotDataset("local/resumed", root=out, video_backend="pyav")
    assert list(ds.meta.episodes["init_state_id"]) == [0, 1, 2]  # job order, whatever the order of recording
    assert ds[0][MAIN_IMAGE_KEY].shape == (3, 256, 256)
    assert not partial_dir(out).exists()


@pytest.mark.slow
def test_sigkill_while_joining_leaves_nothing_complete_looking_and_a_rerun_finishes(tmp_path: Path) -> None:
    """The issue's failure: a recording killed while finalizing. Here --out never exists half-written (the
    dataset is joined under a temporary name), and the same command joins the finished episodes without
    recording any again."""
    out = tmp_path / "ds"
    _kill_group_when(_record(out, "0-1"), lambda lines: any("joining 2 kept episodes" in x for x in lines))
    assert not out.exists() or (out / "meta" / "info.json").exists() and not partial_dir(out).exists(), \
        "--out exists but the recording was not complete"
    if out.exists():
        pytest.skip("the join finished before the kill landed; nothing to continue")
    finished = sorted(p.name for p in (partial_dir(out) / "episodes").glob("*.json"))
    assert finished == ["000-000-000.json", "000-001-000.json"]
    text = _finish(out, "0-1")
    assert "2 of 2 episodes were finished before, 0 to record" in text
    ds = LeRobotDataset("local/resumed", root=out, video_backend="pyav")
    assert ds.num_episodes == 2 and list(ds.meta.episodes["init_state_id"]) == [0, 1]
    assert json.loads((out / "meta" / "info.json").read_text())["total_episodes"] == 2
    assert not partial_dir(out).exists() and not list(tmp_path.glob(".ds.*"))
