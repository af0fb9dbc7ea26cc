"""The LIBERO sample reader on real LeRobot v3 datasets written with lerobot's own writer.

Frames encode their index in colour (red = 10 * frame index, blue = episode and camera, a dark
green band on the top rows), so the test can read back which frames came, in which order and
orientation. Actions are random but known, and the expected 10-D normalised actions are built
here independently: scipy's rotation matrix, its first two columns, and the quantile formula
applied with q01/q99 read straight from the stats JSON.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from scipy.spatial.transform import Rotation

from rlinf_cosmos3.actions import compute_action_stats, write_action_stats
from rlinf_cosmos3.config import ConfigError, load_structured
from rlinf_cosmos3.data import (
    DatasetMismatchError,
    LiberoDataConfig,
    LiberoLeRobotDataset,
    collate_samples,
)
from rlinf_cosmos3.procgroup import keep_scheduling

FPS = 20
SIZE = 256
EPISODE_LENGTHS = (20, 18, 24)
TASKS = ("put the bowl on the plate", "open the drawer", "pick up the ketchup")
BAND_ROWS = 64  # top rows with green = 0; the rest has green = 200
MAIN, WRIST = "observation.images.image", "observation.images.wrist_image"


def _image(frame: int, episode: int, wrist: bool) -> np.ndarray:
    img = np.empty((SIZE, SIZE, 3), dtype=np.uint8)
    img[..., 0] = 10 * frame
    img[..., 1] = 200
    img[:BAND_ROWS, :, 1] = 0
    img[..., 2] = 40 * episode + (20 if wrist else 0)
    return img


def _features(
    image_keys: tuple[str, ...] = (MAIN, WRIST), action_dim: int = 7, state_dim: int = 8, use_videos: bool = True
) -> dict[str, dict]:
    camera = "video" if use_videos else "image"
    feats: dict[str, dict] = {
        key: {"dtype": camera, "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channel"]}
        for key in image_keys
    }
    feats["observation.state"] = {"dtype": "float32", "shape": (state_dim,), "names": None}
    feats["action"] = {"dtype": "float32", "shape": (action_dim,), "names": None}
    return feats


def _write_dataset(
    root: Path,
    lengths: tuple[int, ...],
    actions: list[np.ndarray],
    states: list[np.ndarray],
    fps: int = FPS,
    image_keys: tuple[str, ...] = (MAIN, WRIST),
    use_videos: bool = True,
) -> None:
    feats = _features(image_keys, actions[0].shape[1], states[0].shape[1], use_videos)
    ds = LeRobotDataset.create("test/libero", fps=fps, features=feats, root=root, use_videos=use_videos)
    for ep, length in enumerate(lengths):
        for t in range(length):
            frame = {
                "observation.state": states[ep][t],
                "action": actions[ep][t],
                "task": TASKS[ep % len(TASKS)],
            }
            for key in image_keys:
                frame[key] = _image(t, ep, wrist=key == WRIST)
            ds.add_frame(frame)
        with keep_scheduling():  # SVT-AV1 as root would leave this process real-time
            ds.save_episode(parallel_encoding=False)
    with keep_scheduling():
        ds.finalize()


def _random_actions(rng: np.random.Generator, length: int, dim: int = 7) -> np.ndarray:
    a = rng.uniform(-0.9, 0.9, size=(length, dim)).astype(np.float32)
    a[:, 3:6] *= 0.3  # axis-angle deltas of a few degrees, as in LIBERO
    if dim == 7:
        a[:, 6] = rng.integers(0, 2, size=length)  # gripper g in {0, 1}, 1 = open
    return a


@pytest.fixture(scope="module")
def libero_data(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three episodes at 20 fps with both cameras, plus the action stats written by the helper."""
    base = tmp_path_factory.mktemp("libero_data")
    rng = np.random.default_rng(7)
    actions = [_random_actions(rng, n) for n in EPISODE_LENGTHS]
    states = [rng.normal(size=(n, 8)).astype(np.float32) for n in EPISODE_LENGTHS]
    root = base / "dataset"
    _write_dataset(root, EPISODE_LENGTHS, actions, states)
    stats_path = base / "stats.json"
    write_action_stats(compute_action_stats(actions, chunk_length=16, metadata={"fps": FPS}), stats_path)
    return {"root": root, "stats": stats_path, "actions": actions, "states": states, "base": base}


def _cfg(data: dict, **overrides) -> LiberoDataConfig:
    """Every frame starts a sample (the padded tail is what many tests here check) unless a test says otherwise."""
    return LiberoDataConfig(root=str(data["root"]), stats_path=str(data["stats"]),
                            **{"complete_chunks_only": False, **overrides})


def _expected_actions(a7: np.ndarray, stats_path: Path) -> np.ndarray:
    """Independent 7 -> 10 -> quantile_rot: rot6d = first two matrix columns, column by column."""
    rot = Rotation.from_rotvec(a7[:, 3:6].astype(np.float64)).as_matrix()
    rot6d = np.concatenate([rot[:, :, 0], rot[:, :, 1]], axis=1)
    a10 = np.concatenate([a7[:, 0:3], rot6d, a7[:, 6:7]], axis=1).astype(np.float64)
    block = json.loads(stats_path.read_text())["global_raw"]
    q01, q99 = np.array(block["q01"]), np.array(block["q99"])
    return 2.0 * (a10 - q01) / np.maximum(q99 - q01, 1e-8) - 1.0


def _frame_ids(video: torch.Tensor) -> list[int]:
    """Frame index encoded in red, read below the green band."""
    red = video[:, 0, BAND_ROWS + 16 :, :].float().mean(dim=(1, 2))
    return [round(v / 10) for v in red.tolist()]


def _row(episode: int, frame: int) -> int:
    return sum(EPISODE_LENGTHS[:episode]) + frame


def test_sample_shapes_dtypes_and_metadata(libero_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_data))
    assert len(ds) == sum(EPISODE_LENGTHS)
    s = ds[_row(2, 3)]
    assert s["image"].shape == (17, 3, SIZE, SIZE) and s["image"].dtype == torch.uint8
    assert s["wrist_image"].shape == (17, 3, SIZE, SIZE) and s["wrist_image"].dtype == torch.uint8
    assert s["frame_is_pad"].shape == (17,) and s["frame_is_pad"].dtype == torch.bool
    assert s["actions"].shape == (16, 10) and s["actions"].dtype == torch.float32
    assert s["action_is_pad"].shape == (16,) and s["action_is_pad"].dtype == torch.bool
    assert s["state"].shape == (8,) and s["state"].dtype == torch.float32
    assert s["prompt"] == TASKS[2]
    assert (int(s["episode_index"]), int(s["frame_index"]), int(s["index"])) == (2, 3, _row(2, 3))
    np.testing.assert_array_equal(s["state"].numpy(), libero_data["states"][2][3])


def test_frames_are_t_to_t_plus_16_in_order_rgb_channels_first(libero_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_data))
    s = ds[_row(2, 5)]  # frames 5..21 of a 24-frame episode: no padding
    assert _frame_ids(s["image"]) == list(range(5, 22))
    assert _frame_ids(s["wrist_image"]) == list(range(5, 22))
    assert not s["frame_is_pad"].any()
    blue_main = s["image"][:, 2].float().mean().item()
    blue_wrist = s["wrist_image"][:, 2].float().mean().item()
    assert abs(blue_main - 80) < 4 and abs(blue_wrist - 100) < 4  # episode 2, camera offset 0 / 20
    green = s["image"][:, 1].float()
    assert green[:, 4 : BAND_ROWS - 4].mean() < 10 and green[:, BAND_ROWS + 4 :].mean() > 190  # not flipped


def test_actions_are_10d_normalised_from_the_7d_ones(libero_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_data))
    for ep, t in [(0, 0), (1, 2), (2, 8)]:
        s = ds[_row(ep, t)]
        a7 = libero_data["actions"][ep][t : t + 16]
        assert not s["action_is_pad"].any()
        np.testing.assert_allclose(
            s["actions"].numpy(), _expected_actions(a7, libero_data["stats"]), atol=2e-6
        )


def test_padding_at_episode_end_repeats_the_last_frame_and_action(libero_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_data))
    length = EPISODE_LENGTHS[0]
    a7 = libero_data["actions"][0]

    full = ds[_row(0, length - 17)]  # the last window that fits entirely
    assert not full["frame_is_pad"].any() and not full["action_is_pad"].any()

    edge = ds[_row(0, length - 16)]  # 16 actions fit, the 17th frame does not
    assert edge["frame_is_pad"].tolist() == [False] * 16 + [True]
    assert not edge["action_is_pad"].any()
    assert _frame_ids(edge["image"]) == list(range(length - 16, length)) + [length - 1]

    last = ds[_row(0, length - 1)]
    assert last["frame_is_pad"].tolist() == [False] + [True] * 16
    assert last["action_is_pad"].tolist() == [False] + [True] * 15
    assert _frame_ids(last["image"]) == [length - 1] * 17
    assert _frame_ids(last["wrist_image"]) == [length - 1] * 17
    repeated = np.repeat(a7[length - 1 : length], 16, axis=0)
    np.testing.assert_allclose(
        last["actions"].numpy(), _expected_actions(repeated, libero_data["stats"]), atol=2e-6
    )

    mid = ds[_row(0, length - 5)]
    assert mid["action_is_pad"].tolist() == [False] * 5 + [True] * 11
    expected = np.concatenate([a7[length - 5 :], np.repeat(a7[-1:], 11, axis=0)])
    np.testing.assert_allclose(
        mid["actions"].numpy(), _expected_actions(expected, libero_data["stats"]), atol=2e-6
    )
    # The next episode's first frame never leaks into this one's window.
    assert int(mid["episode_index"]) == 0 and _frame_ids(mid["image"])[-1] == length - 1


def test_complete_chunks_only_drops_the_padded_tail(libero_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_data, complete_chunks_only=True))
    assert len(ds) == sum(n - 16 for n in EPISODE_LENGTHS)
    starts = [(int(ds[i]["episode_index"]), int(ds[i]["frame_index"])) for i in (0, 3, 4, len(ds) - 1)]
    assert starts == [(0, 0), (0, 3), (1, 0), (2, EPISODE_LENGTHS[2] - 17)]
    s = ds[3]
    assert not s["frame_is_pad"].any() and not s["action_is_pad"].any()


def test_episode_subset(libero_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_data, episodes=[1]))
    assert len(ds) == EPISODE_LENGTHS[1]
    s = ds[4]
    assert (int(s["episode_index"]), int(s["frame_index"]), s["prompt"]) == (1, 4, TASKS[1])
    assert _frame_ids(s["image"])[:3] == [4, 5, 6]
    with pytest.raises(DatasetMismatchError, match=r"data\.episodes \[7\] do not exist.*0\.\.2"):
        LiberoLeRobotDataset(_cfg(libero_data, episodes=[0, 7]))


def test_successful_only_filter(libero_data: dict, tmp_path: Path) -> None:
    with pytest.raises(DatasetMismatchError, match="no 'success' column"):
        LiberoLeRobotDataset(_cfg(libero_data, successful_only=True))
    root = tmp_path / "with_success"
    shutil.copytree(libero_data["root"], root)
    # A recorder that keeps failed demos marks them in the episode metadata.
    for path in sorted((root / "meta" / "episodes").glob("*/*.parquet")):
        table = pq.read_table(path)
        success = [int(e) != 1 for e in table.column("episode_index").to_pylist()]
        pq.write_table(table.append_column("success", pa.array(success)), path)
    ds = LiberoLeRobotDataset(
        LiberoDataConfig(root=str(root), stats_path=str(libero_data["stats"]), successful_only=True,
                         complete_chunks_only=False)  # every frame a sample: the count is the episode lengths
    )
    assert ds.episodes == [0, 2]
    assert len(ds) == EPISODE_LENGTHS[0] + EPISODE_LENGTHS[2]
    assert {int(ds[i]["episode_index"]) for i in range(0, len(ds), 5)} == {0, 2}


def test_dataloader_with_two_workers(libero_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_data, episodes=[1]))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_samples)
    batches = list(loader)
    assert [len(b["prompt"]) for b in batches] == [4, 4, 4, 4, 2]
    first = batches[0]
    assert first["image"].shape == (4, 17, 3, SIZE, SIZE) and first["image"].dtype == torch.uint8
    assert first["actions"].shape == (4, 16, 10) and first["action_is_pad"].shape == (4, 16)
    assert first["prompt"] == [TASKS[1]] * 4
    frames = torch.cat([b["frame_index"] for b in batches]).tolist()
    assert frames == list(range(EPISODE_LENGTHS[1]))
    last = batches[-1]
    assert _frame_ids(last["image"][1]) == [EPISODE_LENGTHS[1] - 1] * 17
    direct = ds[17]
    torch.testing.assert_close(last["actions"][1], direct["actions"])
    assert torch.equal(last["image"][1], direct["image"])


@pytest.fixture(scope="module")
def libero_image_data(libero_data: dict) -> dict:
    """The same episodes with the cameras stored as PNG image features (``use_videos=False``)."""
    root = libero_data["base"] / "image_dataset"
    _write_dataset(root, EPISODE_LENGTHS, libero_data["actions"], libero_data["states"], use_videos=False)
    return {**libero_data, "root": root}


def _stored_window(episode: int, t: int, wrist: bool) -> torch.Tensor:
    """The frames written for t .. t+16, the last one repeated past the episode end, as uint8 [17, 3, H, W]."""
    last = EPISODE_LENGTHS[episode] - 1
    frames = [_image(min(t + k, last), episode, wrist) for k in range(17)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)


def test_image_features_give_the_stored_uint8_frames(libero_data: dict, libero_image_data: dict) -> None:
    info = json.loads((libero_image_data["root"] / "meta" / "info.json").read_text())
    assert info["features"][MAIN]["dtype"] == info["features"][WRIST]["dtype"] == "image"
    images = LiberoLeRobotDataset(_cfg(libero_image_data))
    videos = LiberoLeRobotDataset(_cfg(libero_data))
    assert len(images) == len(videos) == sum(EPISODE_LENGTHS)
    length = EPISODE_LENGTHS[0]
    for ep, t in [(0, 0), (0, length - 16), (0, length - 1), (1, 4), (2, 5)]:
        s = images[_row(ep, t)]
        for name in ("image", "wrist_image"):
            assert s[name].dtype == torch.uint8 and s[name].shape == (17, 3, SIZE, SIZE)
            assert torch.equal(s[name], _stored_window(ep, t, wrist=name == "wrist_image"))  # PNG is lossless
        expected_pad = [t + k >= EPISODE_LENGTHS[ep] for k in range(17)]
        assert s["frame_is_pad"].tolist() == expected_pad
        v = videos[_row(ep, t)]  # everything but the (lossy) video pixels is the same
        assert list(s) == list(v)
        for key in ("frame_is_pad", "actions", "action_is_pad", "state", "episode_index", "frame_index", "index"):
            assert torch.equal(s[key], v[key]), key
        assert s["prompt"] == v["prompt"] == TASKS[ep]


def test_image_features_through_dataloader_workers(libero_image_data: dict) -> None:
    ds = LiberoLeRobotDataset(_cfg(libero_image_data, episodes=[2], complete_chunks_only=True))
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate_samples)
    batches = list(loader)
    assert sum(len(b["prompt"]) for b in batches) == len(ds) == EPISODE_LENGTHS[2] - 16
    assert batches[0]["image"].dtype == torch.uint8 and batches[0]["image"].shape == (3, 17, 3, SIZE, SIZE)
    for b in batches:
        for j, t in enumerate(b["frame_index"].tolist()):
            assert torch.equal(b["wrist_image"][j], _stored_window(2, t, wrist=True))


def test_collate_stacks_tensors_and_lists_prompts() -> None:
    a = {"x": torch.zeros(2, 3), "prompt": "a", "i": torch.tensor(1)}
    b = {"x": torch.ones(2, 3), "prompt": "b", "i": torch.tensor(2)}
    batch = collate_samples([a, b])
    assert batch["x"].shape == (2, 2, 3) and batch["prompt"] == ["a", "b"] and batch["i"].tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"'x' of sample 1 is \(3, 3\)"):
        collate_samples([a, {**b, "x": torch.ones(3, 3)}])


def test_fps_mismatch_is_an_error(libero_data: dict) -> None:
    with pytest.raises(DatasetMismatchError, match=r"dataset fps 20 != data\.fps 10"):
        LiberoLeRobotDataset(_cfg(libero_data, fps=10))


def test_stats_made_at_another_fps_are_rejected(libero_data: dict, tmp_path: Path) -> None:
    stats = json.loads(libero_data["stats"].read_text())
    stats["metadata"]["fps"] = 10
    path = write_action_stats(stats, tmp_path / "stats10.json")
    with pytest.raises(ConfigError, match=r"data\.fps.*fps=10"):
        LiberoLeRobotDataset(LiberoDataConfig(root=str(libero_data["root"]), stats_path=str(path)))


@pytest.fixture(scope="module")
def odd_datasets(libero_data: dict) -> dict[str, Path]:
    """Tiny real datasets that break one expectation each."""
    rng = np.random.default_rng(3)
    base = libero_data["base"]
    roots = {}
    specs = {
        "no_wrist": dict(image_keys=(MAIN,), action_dim=7, state_dim=8),
        "action6": dict(image_keys=(MAIN, WRIST), action_dim=6, state_dim=8),
        "state9": dict(image_keys=(MAIN, WRIST), action_dim=7, state_dim=9),
    }
    for name, spec in specs.items():
        root = base / name
        actions = [_random_actions(rng, 3, spec["action_dim"])]
        states = [rng.normal(size=(3, spec["state_dim"])).astype(np.float32)]
        _write_dataset(root, (3,), actions, states, image_keys=spec["image_keys"])
        roots[name] = root
    return roots


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_wrist", r"lacks feature\(s\) \['observation\.images\.wrist_image'\]"),
        ("action6", r"action width: feature 'action' has shape \[6\], expected \[7\]"),
        ("state9", r"state width: feature 'observation\.state' has shape \[9\], expected \[8\]"),
    ],
)
def test_dataset_feature_mismatches(odd_datasets: dict, libero_data: dict, name: str, message: str) -> None:
    cfg = LiberoDataConfig(root=str(odd_datasets[name]), stats_path=str(libero_data["stats"]))
    with pytest.raises(DatasetMismatchError, match=message):
        LiberoLeRobotDataset(cfg)


def test_image_size_mismatch(libero_data: dict) -> None:
    with pytest.raises(DatasetMismatchError, match=r"image size mismatch.*256x256x3.*expects 224x224x3"):
        LiberoLeRobotDataset(_cfg(libero_data, image_size=[224, 224]))


def test_stats_file_missing_or_malformed(libero_data: dict, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.stats_path.*not found"):
        LiberoLeRobotDataset(
            LiberoDataConfig(root=str(libero_data["root"]), stats_path=str(tmp_path / "nope.json"))
        )
    stats = json.loads(libero_data["stats"].read_text())
    stats["global_raw"]["q99"] = stats["global_raw"]["q99"][:9]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(stats))
    with pytest.raises(ConfigError, match=r"data\.stats_path.*global_raw\.q99.*9 values"):
        LiberoLeRobotDataset(LiberoDataConfig(root=str(libero_data["root"]), stats_path=str(bad)))


def test_unknown_normalization_and_missing_dataset(libero_data: dict, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.normalization.*'minmax'"):
        LiberoLeRobotDataset(_cfg(libero_data, normalization="minmax"))
    with pytest.raises(DatasetMismatchError, match=r"no LeRobot dataset.*info\.json"):
        LiberoLeRobotDataset(LiberoDataConfig(root=str(tmp_path), stats_path=str(libero_data["stats"])))


def test_config_loads_from_yaml_values_and_rejects_bad_fields() -> None:
    cfg = load_structured(
        LiberoDataConfig,
        {"root": "/data/libero", "stats_path": "/data/stats.json", "episodes": [0, 3]},
        root="data",
    )
    cfg.validate()
    assert cfg.episodes == [0, 3] and cfg.image_keys == [MAIN, WRIST] and cfg.fps == 20
    with pytest.raises(ConfigError, match=r"data\.root.*required"):
        load_structured(LiberoDataConfig, {"stats_path": "/s.json"}, root="data")
    bad = {
        "num_frames": (0, r"data\.num_frames.*>= 1"),
        "image_keys": ([], r"data\.image_keys.*at least one"),
        "episodes": ([], r"data\.episodes.*empty"),
        "image_size": ([256], r"data\.image_size.*\[height, width\]"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=message):
            LiberoDataConfig(root="/r", stats_path="/s.json", **{name: value}).validate()


def test_missing_video_file_is_named_not_downloaded(libero_data: dict, tmp_path: Path) -> None:
    root = tmp_path / "no_wrist_video"
    shutil.copytree(libero_data["root"], root)
    videos = sorted((root / "videos" / WRIST).glob("*/*.mp4"))
    assert videos
    videos[0].unlink()
    with pytest.raises(
        DatasetMismatchError, match=r"video file of episode 0, camera 'observation\.images\.wrist_image'"
    ):
        LiberoLeRobotDataset(LiberoDataConfig(root=str(root), stats_path=str(libero_data["stats"])))
