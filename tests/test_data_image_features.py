"""Cameras stored as ``image`` features train exactly like cameras stored as ``video``.

The session's recorded LIBERO dataset (real simulator frames, MP4 cameras) is copied into an
image-feature dataset with lerobot's own writer (``use_videos=False``): every frame is the decoded
video frame, with the same actions, states and tasks. Both readers must then give identical
samples, and the real SFT loss of a tiny Cosmos3 must be the same on either.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from PIL import Image

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset, collate_samples
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.libero]  # the recorded dataset needs the simulator

MAIN, WRIST = "observation.images.image", "observation.images.wrist_image"
CAMERAS = (MAIN, WRIST)
LEROBOT_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def copy_as_image_features(src_root: Path, repo_id: str, dst_root: Path) -> Path:
    """Write ``src_root`` again with its cameras as PNG image features: frames = decoded video frames."""
    src = LeRobotDataset(repo_id, root=src_root, video_backend="pyav", return_uint8=True)
    features = {}
    for key, spec in src.meta.features.items():
        if key in LEROBOT_COLUMNS:
            continue
        spec = {k: v for k, v in spec.items() if k != "info"}  # "info" holds the video codec settings
        spec["shape"] = tuple(spec["shape"])
        if key in CAMERAS:
            assert spec["dtype"] == "video"
            spec["dtype"] = "image"
        features[key] = spec
    dst = LeRobotDataset.create(repo_id, fps=src.fps, features=features, root=dst_root, use_videos=False)
    for ep in range(src.meta.total_episodes):
        row = src.meta.episodes[ep]
        for i in range(row["dataset_from_index"], row["dataset_to_index"]):
            item = src[i]
            frame = {key: item[key].permute(1, 2, 0).numpy() for key in CAMERAS}  # uint8 HWC
            frame.update({key: item[key].numpy() for key in features if key not in CAMERAS})
            frame["task"] = item["task"]
            dst.add_frame(frame)
        dst.save_episode(parallel_encoding=False)
    dst.finalize()
    return dst_root


@pytest.fixture(scope="module")
def layouts(recorded_libero_dataset, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("image_features")
    episodes = read_lerobot_episode_actions(recorded_libero_dataset.root)
    stats = compute_action_stats(episodes.episodes, metadata={"fps": recorded_libero_dataset.fps})
    image_root = copy_as_image_features(recorded_libero_dataset.root, recorded_libero_dataset.repo_id,
                                        base / "image_dataset")
    return {"video": recorded_libero_dataset.root, "image": image_root,
            "stats": write_action_stats(stats, base / "stats.json"), "base": base}


@pytest.fixture(scope="module")
def readers(layouts) -> dict[str, LiberoLeRobotDataset]:
    # Every frame a sample: the padded tail windows must read the same from both layouts too.
    return {name: LiberoLeRobotDataset(LiberoDataConfig(root=str(layouts[name]), stats_path=str(layouts["stats"]),
                                                        complete_chunks_only=False))
            for name in ("video", "image")}


def _assert_same_sample(a: dict, b: dict, where: str) -> None:
    assert list(a) == list(b), where
    for key, va in a.items():
        vb = b[key]
        if isinstance(va, torch.Tensor):
            assert (va.dtype, tuple(va.shape)) == (vb.dtype, tuple(vb.shape)), f"{where} {key}"
            assert torch.equal(va, vb), f"{where} {key}: values differ"
        else:
            assert va == vb, f"{where} {key}"


def test_the_copy_stores_images(layouts) -> None:
    meta = LeRobotDataset(layouts["video"].name, root=layouts["image"]).meta
    assert meta.image_keys == list(CAMERAS) and meta.video_keys == []
    assert not (layouts["image"] / "videos").exists()


def test_both_layouts_give_identical_samples(readers) -> None:
    video, image = readers["video"], readers["image"]
    assert len(video) == len(image) > 100
    padded = 0
    for i in range(len(video)):
        a, b = video[i], image[i]
        _assert_same_sample(a, b, f"sample {i}")
        padded += bool(a["frame_is_pad"].any())
    assert padded >= 2 * 16  # the padded tails of both episodes were compared too
    sample = image[0]
    assert sample["image"].dtype == torch.uint8 and sample["image"].shape == (17, 3, 256, 256)


def _png_frames(root: Path) -> dict[str, np.ndarray]:
    """The image dataset's stored PNG bytes, decoded with PIL: ``{camera: uint8 [rows, H, W, 3]}``."""
    files = sorted((root / "data").rglob("*.parquet"))
    table = pq.read_table(files, columns=[*CAMERAS, "index"]).sort_by("index")
    return {key: np.stack([np.asarray(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"))
                           for cell in table.column(key).to_pylist()]) for key in CAMERAS}


def test_image_frames_are_the_stored_png_pixels(layouts, readers) -> None:
    """uint8 from lerobot's float32 ``k / 255`` is exact: the sample equals the PNG bytes' pixels."""
    stored = _png_frames(layouts["image"])
    image = readers["image"]
    meta = LeRobotDataset(layouts["video"].name, root=layouts["image"]).meta
    for i in (0, 7, len(image) // 2, len(image) - 1):
        s = image[i]
        ep = meta.episodes[int(s["episode_index"])]
        last = ep["dataset_to_index"] - 1
        rows = [min(int(s["index"]) + k, last) for k in range(17)]  # padded frames repeat the last one
        for key, name in ((MAIN, "image"), (WRIST, "wrist_image")):
            expected = torch.from_numpy(stored[key][rows]).permute(0, 3, 1, 2)
            assert torch.equal(s[name], expected), f"sample {i} {name}"


def test_frames_equal_lerobots_own_float_frames_rounded(recorded_libero_dataset, layouts, readers) -> None:
    """lerobot's own image path gives float32 k / 255: rounding x * 255 is exact and gives our frames and pads."""
    deltas = [k / recorded_libero_dataset.fps for k in range(17)]
    own = LeRobotDataset(recorded_libero_dataset.repo_id, root=layouts["image"], video_backend="pyav",
                         delta_timestamps={MAIN: deltas, WRIST: deltas}, return_uint8=True)
    image = readers["image"]
    for i in (0, 40, len(image) - 3):
        item, s = own[i], image[i]
        for key, name in ((MAIN, "image"), (WRIST, "wrist_image")):
            scaled = item[key] * 255
            assert item[key].dtype == torch.float32 and float((scaled - scaled.round()).abs().max()) < 1e-4
            assert torch.equal(scaled.round().to(torch.uint8), s[name]), f"sample {i} {name}"
            assert torch.equal(item[f"{key}_is_pad"], s["frame_is_pad"])


def test_sft_loss_is_the_same_on_both_layouts(readers, layouts) -> None:
    """A real SFT loss (tiny Cosmos3) on an image-feature batch runs and equals the video batch's."""
    policy = Cosmos3Policy.from_pretrained(write_model_dir(layouts["base"] / "tiny", preset="tiny", seed=0))
    indices = [3, len(readers["video"]) - 2]  # one full window, one padded tail
    batches = {name: collate_samples([r[i] for i in indices]) for name, r in readers.items()}
    assert batches["image"]["frame_is_pad"][1].any()
    loss_image, metrics_image = policy.sft_loss(batches["image"], torch.Generator().manual_seed(0))
    loss_video, metrics_video = policy.sft_loss(batches["video"], torch.Generator().manual_seed(0))
    assert torch.isfinite(loss_image) and loss_image.requires_grad
    assert torch.equal(loss_image, loss_video)
    assert all(torch.equal(metrics_image[k], metrics_video[k]) for k in metrics_video)


def test_episodes_read_whole_give_the_same_samples(readers) -> None:
    """``read_episode`` (each frame decoded once: video frames through lerobot, image cells as PNG) gives every
    sample of both layouts exactly as ``reader[i]``, the padded tails included."""
    for name, reader in readers.items():
        positions = []
        for episode in reader.sample_episodes():
            read = reader.read_episode(episode)
            for i, position in enumerate(read.positions):
                _assert_same_sample(read.sample(i), reader[int(position)], f"{name} episode {episode} sample {i}")
                positions.append(int(position))
        assert positions == list(range(len(reader))), name
