"""Recording scripted demonstrations with the real LIBERO simulator and reading them back with
lerobot's own ``LeRobotDataset`` (offline, pyav video backend)."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from rlinf_cosmos3.config.libero_suites import NOOP_ACTION, NUM_SETTLE_STEPS
from rlinf_cosmos3.demos.lerobot_writer import (
    ACTION_KEY,
    MAIN_IMAGE_KEY,
    STATE_KEY,
    WRIST_IMAGE_KEY,
    DemoDatasetWriter,
    command_to_stored_action,
)
from rlinf_cosmos3.paths import REPO_ROOT
from rlinf_cosmos3.sim.client import LiberoSimProcess

TASK0 = "pick up the black bowl between the plate and the ramekin and place it on the plate"  # task.language
CLI = REPO_ROOT / "toolkits" / "libero" / "record_demos.py"


def _load_cli():
    spec = importlib.util.spec_from_file_location("record_demos_cli", CLI)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli = _load_cli()
parse_init_states, parse_task_ids = cli.parse_init_states, cli.parse_task_ids


# ---------------------------------------------------------------------------- pure parts
def test_init_state_and_task_id_parsing() -> None:
    assert parse_init_states(["3"]) == [0, 1, 2]
    assert parse_init_states(["7,"]) == [7]
    assert parse_init_states(["0", "3", "7"]) == [0, 3, 7]
    assert parse_init_states(["0,3", "10-12"]) == [0, 3, 10, 11, 12]
    assert parse_task_ids(["all"], "libero_object") == list(range(10))
    assert parse_task_ids(["0", "1"], "libero_spatial") == [0, 1]
    with pytest.raises(Exception, match="count"):
        parse_init_states(["0"])
    with pytest.raises(Exception, match="empty range"):
        parse_task_ids(["5-2"], "libero_spatial")


def test_stored_gripper_follows_the_dataset_convention() -> None:
    open_cmd = np.array([0.1, -0.2, 0.3, 0.0, 0.01, -0.01, -1.0])
    stored = command_to_stored_action(open_cmd)
    assert stored.dtype == np.float32
    np.testing.assert_allclose(stored[:6], open_cmd[:6], rtol=1e-6)
    assert stored[6] == 1.0  # -1 (open) -> g = 1
    assert command_to_stored_action(np.r_[np.zeros(6), 1.0])[6] == 0.0  # +1 (close) -> g = 0
    with pytest.raises(ValueError):
        command_to_stored_action(np.zeros(6))


def test_writer_refuses_a_non_empty_output(tmp_path) -> None:
    (tmp_path / "x.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        DemoDatasetWriter(tmp_path, "local/x")


def test_writing_videos_leaves_this_process_on_normal_scheduling(tmp_path) -> None:
    """SVT-AV1 (lerobot's codec) run as root switches the encoding thread to SCHED_FIFO 99; the
    writer puts it back, else every later child process is real-time and starves the machine."""
    import os

    from rlinf_cosmos3.demos.lerobot_writer import EpisodeRecord

    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    writer = DemoDatasetWriter(tmp_path / "ds", "local/sched", image_size=32)
    for _ in range(3):
        writer.add_frame(np.zeros((32, 32, 3), np.uint8), np.zeros((32, 32, 3), np.uint8), np.zeros(8, np.float32),
                         np.zeros(7), "pick")
    writer.save_episode(EpisodeRecord(True, True, "libero_spatial", 0, 0, 10))
    writer.finalize()
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before


# ---------------------------------------------------------------------------- the recorded dataset
@pytest.fixture(scope="module")
def dataset(recorded_libero_dataset) -> LeRobotDataset:
    return LeRobotDataset(recorded_libero_dataset.repo_id, root=recorded_libero_dataset.root,
                          video_backend="pyav")


def _episode_frames(ds: LeRobotDataset, episode: int) -> list[dict]:
    ep = ds.meta.episodes[episode]
    return [ds[i] for i in range(ep["dataset_from_index"], ep["dataset_to_index"])]


@pytest.mark.slow
def test_dataset_layout_and_features(recorded_libero_dataset, dataset) -> None:
    info = json.loads((recorded_libero_dataset.root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert dataset.fps == 20 and info["fps"] == 20
    assert dataset.num_episodes == 2
    feats = dataset.meta.features
    for key in (MAIN_IMAGE_KEY, WRIST_IMAGE_KEY):
        assert feats[key]["dtype"] == "video" and tuple(feats[key]["shape"]) == (256, 256, 3)
    assert feats[STATE_KEY]["dtype"] == "float32" and tuple(feats[STATE_KEY]["shape"]) == (8,)
    assert feats[ACTION_KEY]["dtype"] == "float32" and tuple(feats[ACTION_KEY]["shape"]) == (7,)
    sample = dataset[0]
    assert sample[MAIN_IMAGE_KEY].shape == (3, 256, 256) and sample[WRIST_IMAGE_KEY].shape == (3, 256, 256)
    assert sample["task"] == TASK0
    lengths = [r.num_steps for r in recorded_libero_dataset.results]
    assert list(dataset.meta.episodes["length"]) == lengths and dataset.num_frames == sum(lengths)
    for episode in range(2):
        frames = _episode_frames(dataset, episode)
        idx = np.array([int(f["frame_index"]) for f in frames])
        np.testing.assert_array_equal(idx, np.arange(len(frames)))
        np.testing.assert_allclose([float(f["timestamp"]) for f in frames], idx / 20.0, atol=1e-4)


@pytest.mark.slow
def test_actions_and_gripper_convention(dataset) -> None:
    for episode in range(2):
        frames = _episode_frames(dataset, episode)
        actions = torch.stack([f[ACTION_KEY] for f in frames]).numpy()
        states = torch.stack([f[STATE_KEY] for f in frames]).numpy()
        assert np.all(np.abs(actions[:, :6]) <= 1.0 + 1e-6)
        grip = actions[:, 6]
        assert set(np.unique(grip).tolist()) <= {0.0, 1.0}
        assert grip[0] == 1.0, "the scripted policy starts with the gripper open (g = 1)"
        # while the stored gripper says "closed" (g = 0) for a while, the fingers close on the bowl
        closed = np.flatnonzero(grip == 0.0)
        assert closed.size > 5
        assert states[closed[-1], 6] < states[0, 6] - 0.005
        # commanded motion shows up in the next state: action t drives state t+1 - state t
        moved = states[1:, :3] - states[:-1, :3]
        for axis in range(3):
            corr = np.corrcoef(actions[:-1, axis], moved[:, axis])[0, 1]
            assert corr > 0.5, f"axis {axis}: action/state correlation {corr:.2f}"


@pytest.mark.slow
def test_success_metadata_matches_the_simulator(recorded_libero_dataset, dataset) -> None:
    episodes = dataset.meta.episodes
    results = recorded_libero_dataset.results
    assert [r.episode_index for r in results] == [0, 1]
    assert list(episodes["success"]) == [r.success for r in results]
    assert list(episodes["success_once"]) == [r.success_once for r in results]
    assert list(episodes["init_state_id"]) == [0, 1]
    assert list(episodes["task_id"]) == [0, 0]
    assert list(episodes["suite"]) == ["libero_spatial"] * 2
    assert list(episodes["num_settle_steps"]) == [NUM_SETTLE_STEPS] * 2
    # the scripted policy solves init state 0 of this task (also checked in test_sim_bridge)
    assert results[0].success and results[0].success_once


@pytest.mark.slow
def test_first_frame_is_the_settled_simulator_observation(recorded_libero_dataset, dataset) -> None:
    """Frame 0 = LIBERO init state 0 after the unrecorded settle steps, images rotated 180° as in
    LIBERO's datasets (compared with a fresh simulator; the video is lossy, the state exact)."""
    with LiberoSimProcess(name="check") as proc:
        proc.make("libero_spatial", 0)
        proc.reset(0)
        obs = proc.chunk_step(np.tile(np.asarray(NOOP_ACTION), (NUM_SETTLE_STEPS, 1)))
    frame = dataset[0]
    np.testing.assert_allclose(frame[STATE_KEY].numpy(), obs["state"], atol=1e-6)
    for key, sim_key in ((MAIN_IMAGE_KEY, "main_image"), (WRIST_IMAGE_KEY, "wrist_image")):
        stored = frame[key].permute(1, 2, 0).numpy() * 255.0
        same = np.abs(stored - obs[sim_key]).mean()
        flipped = np.abs(stored - obs[sim_key][::-1, ::-1]).mean()
        assert same < 6.0 and flipped > 3 * same, f"{key}: diff {same:.1f} vs flipped {flipped:.1f}"


@pytest.mark.slow
def test_cli_drops_failed_episodes_and_reports_per_task(tmp_path) -> None:
    """5 recorded steps cannot solve the task: the episode is attempted, reported and dropped."""
    out = tmp_path / "ds"
    summary = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(CLI), "--suite", "libero_spatial", "--task-ids", "0", "--init-states", "2,",
         "--max-steps", "5", "--out", str(out), "--repo-id", "local/dropped", "--no-progress",
         "--summary-json", str(summary)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "task  0: 0/1 = 0%" in proc.stdout and "0 kept" in proc.stdout
    report = json.loads(summary.read_text())
    (episode,) = report["episodes"]
    assert episode["init_state_id"] == 2 and episode["num_steps"] == 5
    assert episode["success"] is False and episode["episode_index"] is None
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 0


def _children_of(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.slow
def test_ctrl_c_stops_simulators_and_keeps_saved_episodes(tmp_path) -> None:
    """SIGINT after the first finished episode: exit code 130, no simulator left, nothing at --out (it is
    not complete), and the finished episodes are in <out>.partial, each a readable one-episode dataset, for
    the same command to continue (tests/test_record_atomic_resume.py). 20 episodes are asked for (~5 s
    each), so the recording is still running when the signal lands."""
    from rlinf_cosmos3.demos.episode_store import partial_dir

    out = tmp_path / "ds"
    cli = subprocess.Popen(
        [sys.executable, str(CLI), "--suite", "libero_spatial", "--task-ids", "0", "--init-states", "20",
         "--max-steps", "8", "--keep-failed", "--out", str(out), "--repo-id", "local/interrupted", "--no-progress"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert cli.stderr is not None
        sims: list[int] = []
        for line in cli.stderr:
            sims = sims or _children_of(cli.pid)
            if "init 0: " in line and "kept" in line:
                break
        assert sims, "the recorder started no simulator process"
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 130, err[-2000:]
    assert "interrupted" in err and "run the same command again" in err
    deadline = time.monotonic() + 10  # children (simulators, episode writers) see their parent go within moments
    while any(Path(f"/proc/{pid}").exists() for pid in sims) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in sims:
        assert not Path(f"/proc/{pid}").exists(), f"child {pid} outlived the interrupted recorder"
    assert not out.exists()
    finished = sorted((partial_dir(out) / "episodes").glob("*.json"))
    assert 1 <= len(finished) < 20
    ds = LeRobotDataset("local/interrupted", root=finished[0].with_suffix(""), video_backend="pyav")
    assert ds.num_episodes == 1 and ds[0][MAIN_IMAGE_KEY].shape == (3, 256, 256)


@pytest.mark.slow
def test_tasks_the_policy_cannot_do_are_skipped_not_faked(tmp_path) -> None:
    """libero_goal task 0 ('open the middle drawer') has no pick-and-place goal: both episodes are
    reported as skipped, with the reason, and nothing is written."""
    from rlinf_cosmos3.demos.recorder import RecordConfig, per_task_summary, record_demos, success_rate

    cfg = RecordConfig(suite="libero_goal", task_ids=[0], init_state_ids=[0, 1], out=tmp_path / "ds",
                       repo_id="local/skipped", keep_failed=True)
    results = record_demos(cfg, show_progress=False)
    assert [r.skipped is not None for r in results] == [True, True]
    assert "open" in results[0].skipped and results[1].skipped == results[0].skipped
    assert all(r.episode_index is None and not r.success for r in results)
    assert results[1].task == results[0].task == "open the middle drawer of the cabinet"
    row = per_task_summary(results)[0]
    assert row["episodes"] == 0 and row["skipped"] == results[0].skipped
    assert success_rate(results) == 0.0
    assert json.loads((cfg.out / "meta" / "info.json").read_text())["total_episodes"] == 0


@pytest.mark.slow
def test_cli_can_store_the_cameras_as_image_features(tmp_path) -> None:
    """``--camera-storage image``: PNG image features (no videos), and the training reader opens them."""
    import io

    import pyarrow.parquet as pq
    from PIL import Image

    from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
    from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset

    out = tmp_path / "ds"
    proc = subprocess.run(
        [sys.executable, str(CLI), "--suite", "libero_spatial", "--task-ids", "0", "--init-states", "1",
         "--max-steps", "20", "--keep-failed", "--camera-storage", "image", "--out", str(out),
         "--repo-id", "local/images", "--no-progress"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((out / "meta" / "info.json").read_text())
    for key in (MAIN_IMAGE_KEY, WRIST_IMAGE_KEY):
        assert info["features"][key]["dtype"] == "image" and info["features"][key]["shape"] == [256, 256, 3]
    assert info["video_path"] is None and not (out / "videos").exists()

    stats = compute_action_stats(read_lerobot_episode_actions(out).episodes, metadata={"fps": 20})
    reader = LiberoLeRobotDataset(LiberoDataConfig(root=str(out), stats_path=str(
        write_action_stats(stats, tmp_path / "stats.json")), complete_chunks_only=False))  # every frame a sample
    assert len(reader) == 20
    sample = reader[0]
    assert sample["image"].dtype == torch.uint8 and sample["image"].shape == (17, 3, 256, 256)
    assert sample["wrist_image"].dtype == torch.uint8 and not sample["frame_is_pad"].any()
    table = pq.read_table(sorted((out / "data").rglob("*.parquet")), columns=[MAIN_IMAGE_KEY, "index"])
    first = table.sort_by("index").column(MAIN_IMAGE_KEY)[0].as_py()["bytes"]
    stored = np.array(Image.open(io.BytesIO(first)).convert("RGB"))
    assert torch.equal(sample["image"][0], torch.from_numpy(stored).permute(2, 0, 1))
    assert float(sample["image"].float().std()) > 10  # a rendered scene, not a blank frame


@pytest.mark.slow
@pytest.mark.parametrize(("period", "burst"), [(1, 1), (5, 2)], ids=["every_command", "bursts"])
def test_clean_labels_keep_the_noisy_trajectory_and_drop_the_noise(tmp_path, period: int, burst: int) -> None:
    """``--action-noise`` with ``--recorded-action clean`` (DART-style): the same seed runs the same noisy
    commands in the simulator (identical recorded states), but each frame's label is the scripted command
    before the noise: the two recordings differ in the motion dimensions by at most the noise, never in
    the gripper. With bursts (``--noise-period 5 --noise-burst 2``) only commands 0-1, 5-6, ... carry noise."""
    import pyarrow.parquet as pq

    from rlinf_cosmos3.actions import read_lerobot_episode_actions
    from rlinf_cosmos3.demos.recorder import RecordConfig, record_demos
    from rlinf_cosmos3.demos.scripted_policy import ScriptedPolicyConfig

    noise = 0.2
    recorded = {}
    for mode in ("executed", "clean"):
        cfg = RecordConfig(suite="libero_spatial", task_ids=[0], init_state_ids=[0], out=tmp_path / mode,
                           repo_id=f"local/{mode}", max_steps=20, keep_failed=True, camera_storage="image",
                           policy=ScriptedPolicyConfig(noise_std=noise, noise_period=period, noise_burst=burst),
                           recorded_action=mode)
        record_demos(cfg, show_progress=False)
        states = pq.read_table(sorted((cfg.out / "data").rglob("*.parquet")), columns=[STATE_KEY, "index"])
        recorded[mode] = (np.stack(states.sort_by("index").column(STATE_KEY).to_pylist()),
                          read_lerobot_episode_actions(cfg.out).episodes[0])
    (states_e, actions_e), (states_c, actions_c) = recorded["executed"], recorded["clean"]
    assert actions_e.shape == actions_c.shape == (20, 7)
    np.testing.assert_array_equal(states_e, states_c)  # one trajectory: the same commands ran
    diff = np.abs(actions_e[:, :6] - actions_c[:, :6])
    noisy = np.arange(20) % period < burst
    assert diff.max() <= 5 * noise and diff[noisy].mean() > noise / 4, diff  # the labels lack the noise
    assert (diff[noisy].max(axis=1) > 0).all() and not diff[~noisy].any(), diff  # ... where it was added
    np.testing.assert_array_equal(actions_e[:, 6], actions_c[:, 6])


@pytest.mark.slow
def test_place_jitter_repeats_record_distinct_successful_demonstrations(tmp_path) -> None:
    """``--place-jitter 0.03 --repeats 2`` on one init state: two episodes of that state (``repeat`` 0 and 1 in
    meta/episodes), both solved by the simulator's check, identical up to the carry (the jitter is drawn for
    the carry waypoint only) and different afterwards: the object is carried to two different points beside
    the plate and lowered onto it from there."""
    from rlinf_cosmos3.actions import read_lerobot_episode_actions

    out = tmp_path / "jitter"
    rc = cli.main(["--suite", "libero_spatial", "--task-ids", "0", "--init-states", "0,", "--place-jitter", "0.03",
                   "--repeats", "2", "--num-envs", "2", "--camera-storage", "image", "--out", str(out),
                   "--no-progress"])
    assert rc == 0
    dataset = LeRobotDataset("local/jitter", root=out)
    episodes = dataset.meta.episodes
    assert list(episodes["init_state_id"]) == [0, 0] and sorted(episodes["repeat"]) == [0, 1]
    assert list(episodes["success"]) == [True, True]
    a, b = read_lerobot_episode_actions(out).episodes[:2]
    first_diff = int(np.flatnonzero(np.abs(a[: min(len(a), len(b))] - b[: min(len(a), len(b))]).max(axis=1) > 1e-6)[0])
    grip_closed = int(np.flatnonzero(a[:, 6] == 0.0)[0])  # the stored gripper: 0 = closed
    assert first_diff > grip_closed + 10  # the same approach, grasp and lift


@pytest.mark.slow
def test_packed_videos_hold_the_same_frames_as_one_file_per_episode(recorded_libero_dataset, dataset,
                                                                     tmp_path) -> None:
    """The join's two video layouts: the session's recording (one MP4 per episode and camera, the default)
    and the same episodes packed into one MP4 per camera as lerobot packs them (--concatenate-videos)."""
    from rlinf_cosmos3.demos.recorder import RecordConfig, record_demos

    per_episode = sorted((recorded_libero_dataset.root / "videos").rglob("*.mp4"))
    assert len(per_episode) == 2 * 2  # 2 episodes x 2 cameras
    cfg = RecordConfig(suite="libero_spatial", task_ids=[0], init_state_ids=[0, 1], out=tmp_path / "packed",
                       repo_id="local/recorded_libero", keep_failed=True, num_envs=2, concatenate_videos=True)
    record_demos(cfg, show_progress=False)
    assert len(sorted((cfg.out / "videos").rglob("*.mp4"))) == 2  # one per camera
    packed = LeRobotDataset("local/recorded_libero", root=cfg.out, video_backend="pyav")
    assert packed.num_frames == dataset.num_frames
    for i in range(dataset.num_frames):
        a, b = dataset[i], packed[i]
        for key in (MAIN_IMAGE_KEY, WRIST_IMAGE_KEY, STATE_KEY, ACTION_KEY):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"frame {i}, {key}")


@pytest.mark.slow
def test_what_each_episode_holds_does_not_depend_on_which_process_recorded_it(tmp_path) -> None:
    """The recorder serves each simulator as soon as it replies, so which process records which job depends
    on timing. Three short jobs (two tasks: a process changes task mid-way) on one process and on two
    give the same dataset: episode order, decoded frames, states and actions."""
    from rlinf_cosmos3.demos.recorder import RecordConfig, record_demos

    datasets = []
    for envs in (1, 2):
        cfg = RecordConfig(suite="libero_spatial", task_ids=[0, 1], init_state_ids=[0, 1], out=tmp_path / f"e{envs}",
                           repo_id="local/schedule", keep_failed=True, num_envs=envs, max_steps=12,
                           camera_storage="image")
        results = record_demos(cfg, show_progress=False)
        assert [(r.task_id, r.init_state_id, r.num_steps) for r in results] == [
            (0, 0, 12), (0, 1, 12), (1, 0, 12), (1, 1, 12)]
        datasets.append(LeRobotDataset("local/schedule", root=cfg.out))
    one, two = datasets
    assert one.num_frames == two.num_frames == 4 * 12
    assert list(one.meta.episodes["task_id"]) == list(two.meta.episodes["task_id"]) == [0, 0, 1, 1]
    assert list(one.meta.episodes["init_state_id"]) == list(two.meta.episodes["init_state_id"]) == [0, 1, 0, 1]
    for i in range(one.num_frames):
        a, b = one[i], two[i]
        for key in (MAIN_IMAGE_KEY, WRIST_IMAGE_KEY, STATE_KEY, ACTION_KEY):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"frame {i}, {key}")
