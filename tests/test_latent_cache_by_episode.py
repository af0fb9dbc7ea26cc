"""The latent cache built episode by episode (each stored frame decoded and composed once), as the SFT worker
builds it: the same rows as the sample-by-sample build, whatever the ranks, and the canvases of every sample
the same as the per-sample canvases, exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dataset_helpers import SHORT_FRAMES
from dist_helpers import run_as_thread_ranks

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset
from rlinf_cosmos3.data import latent_cache as lc
from rlinf_cosmos3.models.cosmos3.canvas_samples import CanvasEpisodes, CanvasSamples
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
from rlinf_cosmos3.models.cosmos3.processor import CANVAS_KEY
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

pytestmark = [pytest.mark.libero]

FRAMES = SHORT_FRAMES  # per episode; two episodes
_FIELDS = ("actions", "action_is_pad", "frame_is_pad", "state", "idle_frames", "episode_index", "frame_index",
           "index", "vision_frame_valid")


@pytest.fixture(scope="module")
def inputs(short_libero_recording: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real LIBERO episodes cut at 20 frames (two init states), their stats and a tiny random Cosmos3."""
    root = tmp_path_factory.mktemp("cache_by_episode")
    stats = compute_action_stats(read_lerobot_episode_actions(short_libero_recording).episodes,
                                 metadata={"fps": 20})
    return {"root": root, "data": short_libero_recording, "stats": write_action_stats(stats, root / "stats.json"),
            "model": write_model_dir(root / "tiny", preset="tiny", seed=0)}


def _reader(inputs: dict[str, Path], **changes: Any) -> LiberoLeRobotDataset:
    return LiberoLeRobotDataset(LiberoDataConfig(root=str(inputs["data"]), repo_id="local/short",
                                                 stats_path=str(inputs["stats"]), **changes))


def _key(reader: LiberoLeRobotDataset, inputs: dict[str, Path]) -> dict[str, Any]:
    return lc.cache_key(reader.cfg, inputs["model"], vae_dtype="float32", canvas=(192, 320), resolution_tier=256)


def _build(inputs: dict[str, Path], reader: LiberoLeRobotDataset, out: Path, world: int, by_episode: bool) -> Path:
    """Built by ``world`` concurrent "ranks" (threads with a real barrier), each with its own model."""
    policies = [Cosmos3Policy.from_pretrained(inputs["model"]) for _ in range(world)]

    def rank(r: int, barrier: Any) -> None:
        cfg = policies[r].cfg
        lc.build_cache(CanvasSamples(reader, cfg), policies[r].processor.encode_pixels, out, _key(reader, inputs),
                       rank=r, world_size=world, barrier=barrier, batch_size=5,
                       episodes=CanvasEpisodes(reader, cfg) if by_episode else None)

    run_as_thread_ranks(world, rank)
    return out


@pytest.mark.parametrize("complete_chunks_only", [False, True])
def test_episode_reads_give_the_readers_samples(inputs, complete_chunks_only) -> None:
    """Every sample of every episode, read once per episode, equals ``reader[i]``: pixels, padding, actions,
    indexes and prompt, dtype and value."""
    reader = _reader(inputs, complete_chunks_only=complete_chunks_only)
    assert reader.sample_episodes() == [0, 1]
    seen = []
    for episode in reader.sample_episodes():
        read = reader.read_episode(episode)
        assert read.frames["image"].shape == (FRAMES, 3, 256, 256)
        for i, position in enumerate(read.positions):
            got, want = read.sample(i), reader[int(position)]
            assert list(sorted(got)) == list(sorted(want))
            for name, value in want.items():
                if isinstance(value, torch.Tensor):
                    assert got[name].dtype == value.dtype and torch.equal(got[name], value), (position, name)
                else:
                    assert got[name] == value, (position, name)
            seen.append(int(position))
    assert sorted(seen) == list(range(len(reader)))
    assert len(reader) == (2 * FRAMES if not complete_chunks_only else 2 * (FRAMES - 16))


def test_episode_canvases_are_the_per_sample_canvases(inputs) -> None:
    reader = _reader(inputs, complete_chunks_only=False)
    cfg = Cosmos3Policy.from_pretrained(inputs["model"]).cfg
    samples, episodes = CanvasSamples(reader, cfg), CanvasEpisodes(reader, cfg)
    for e in range(len(episodes)):
        read = episodes[e]
        assert set(read.frames) == {CANVAS_KEY}
        np.testing.assert_array_equal(read.positions, episodes.positions(e))
        for i in (0, len(read.positions) // 2, len(read.positions) - 1):
            assert torch.equal(read.sample(i)[CANVAS_KEY], samples[int(read.positions[i])][CANVAS_KEY])


def test_the_cache_by_episode_holds_the_rows_of_the_cache_by_sample(inputs, tmp_path) -> None:
    """Two ranks by episode (each rank one whole episode) and two ranks by sample (every other sample): the
    cached sample at every position is the same; the latents agree to float32 noise (VAE batches differ)."""
    reader = _reader(inputs, complete_chunks_only=False)
    by_sample = lc.LatentCacheDataset(_build(inputs, reader, tmp_path / "by_sample", 2, by_episode=False))
    by_episode = lc.LatentCacheDataset(_build(inputs, reader, tmp_path / "by_episode", 2, by_episode=True))
    assert len(by_episode) == len(by_sample) == len(reader) == 2 * FRAMES
    shard_episodes = [set(np.load(s / "episode_index.npy").tolist()) for s in sorted((tmp_path / "by_episode")
                                                                                      .glob("shard_*"))]
    assert shard_episodes == [{0}, {1}], "each rank encodes whole episodes"
    for i in range(len(reader)):
        a, b = by_episode[i], by_sample[i]
        assert a["prompt"] == b["prompt"]
        for name in _FIELDS:
            assert torch.equal(a[name], b[name]), (i, name)
        torch.testing.assert_close(a["x0_vision"], b["x0_vision"], rtol=1e-5, atol=1e-5)
