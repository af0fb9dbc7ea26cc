"""The latent cache: frozen-VAE latents of a real recorded LIBERO dataset, computed once and reused.

A short real recording (two libero_spatial episodes cut at 20 steps) keeps the VAE work small on CPU.
The cache's samples must be the reader's samples with latents instead of pixels; a cache made from
other inputs is refused; an interrupted build leaves nothing that looks complete; and SFT through the
launcher builds it on first use, reuses it, and resumes exactly with it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from dataset_helpers import SHORT_FRAMES
from dist_helpers import run_as_thread_ranks
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset, collate_samples
from rlinf_cosmos3.data import latent_cache as lc
from rlinf_cosmos3.models.cosmos3.canvas_samples import CanvasSamples
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
from rlinf_cosmos3.models.cosmos3.processor import CANVAS_KEY
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

pytestmark = [pytest.mark.libero]

REPO = Path(__file__).resolve().parent.parent
FRAMES = SHORT_FRAMES  # per episode; two episodes


@pytest.fixture(scope="module")
def inputs(short_libero_recording: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two 20-frame real LIBERO episodes, their stats and a tiny random Cosmos3."""
    root = tmp_path_factory.mktemp("latent_cache")
    episodes = read_lerobot_episode_actions(short_libero_recording)
    stats = compute_action_stats(episodes.episodes, metadata={"fps": 20})
    return {"root": root, "data": short_libero_recording, "stats": write_action_stats(stats, root / "stats.json"),
            "model": write_model_dir(root / "tiny", preset="tiny", seed=0)}


def _data_cfg(inputs: dict[str, Path]) -> LiberoDataConfig:
    # Every frame a sample: the cache must hold the padded tail windows as well.
    return LiberoDataConfig(root=str(inputs["data"]), repo_id="local/short", stats_path=str(inputs["stats"]),
                            complete_chunks_only=False)


def _key(inputs: dict[str, Path], **changes: Any) -> dict[str, Any]:
    data = _data_cfg(inputs)
    for name, value in changes.pop("data", {}).items():
        setattr(data, name, value)
    args = {"vae_dtype": "float32", "canvas": (192, 320), "resolution_tier": 256, **changes}
    return lc.cache_key(data, inputs["model"], **args)


@pytest.fixture(scope="module")
def policy(inputs: dict[str, Path]) -> Cosmos3Policy:
    return Cosmos3Policy.from_pretrained(inputs["model"])


@pytest.fixture(scope="module")
def built(inputs: dict[str, Path]) -> Path:
    """Built by two concurrent "ranks" (threads with a real barrier), each encoding its share with its own
    model (as ranks do: the Wan VAE keeps per-call state on its modules, so one VAE is not thread-safe)."""
    reader = LiberoLeRobotDataset(_data_cfg(inputs))
    cache_dir = inputs["root"] / "cache"
    encoders = [Cosmos3Policy.from_pretrained(inputs["model"]).processor.encode_pixels for _ in range(2)]
    run_as_thread_ranks(2, lambda r, barrier: lc.build_cache(reader, encoders[r], cache_dir, _key(inputs), rank=r,
                                                              world_size=2, barrier=barrier, batch_size=4))
    return cache_dir


def test_cached_samples_are_the_readers_samples_with_latents(inputs, policy, built) -> None:
    reader = LiberoLeRobotDataset(_data_cfg(inputs))
    cached = lc.LatentCacheDataset(built)
    assert len(cached) == len(reader) == 2 * FRAMES
    manifest = lc.read_manifest(built)
    assert manifest["world_size"] == 2 and manifest["latent_shape"] == [48, 5, 12, 20]
    for i in (0, 7, FRAMES - 1):  # the last of episode 0 has padded frames and actions
        sample, pixels = cached[i], reader[i]
        for key in ("actions", "action_is_pad", "frame_is_pad", "state", "episode_index", "frame_index", "index"):
            assert torch.equal(sample[key], pixels[key]), key
        assert sample["prompt"] == pixels["prompt"]
        latents, valid = policy.processor.encode_pixels(collate_samples([pixels]))
        assert torch.allclose(sample["x0_vision"], latents[0], atol=1e-5, rtol=1e-5)
        assert torch.equal(sample["vision_frame_valid"], valid[0])
    assert bool(cached[FRAMES - 1]["frame_is_pad"].any()) and not bool(cached[FRAMES - 1]["vision_frame_valid"].all())


def test_loss_from_cached_latents_equals_loss_from_pixels(inputs, policy, built) -> None:
    reader, cached = LiberoLeRobotDataset(_data_cfg(inputs)), lc.LatentCacheDataset(built)
    rows = [3, 11]
    gens = lambda: [torch.Generator().manual_seed(5 + i) for i in rows]  # noqa: E731
    from_pixels, _ = policy.sft_loss(collate_samples([reader[i] for i in rows]), gens())
    from_cache, _ = policy.sft_loss(collate_samples([cached[i] for i in rows]), gens())
    torch.testing.assert_close(from_cache, from_pixels, rtol=1e-5, atol=1e-6)


def test_canvases_composed_by_the_loaders_workers_are_the_processors(inputs, policy) -> None:
    """What the SFT worker reads (CanvasSamples through DataLoader worker processes) gives the canvases,
    latents and loss the processor gives from the two camera views, exactly."""
    from torch.utils.data import DataLoader, Subset

    reader, rows = LiberoLeRobotDataset(_data_cfg(inputs)), [0, 7, FRAMES - 1]
    cfg = policy.cfg
    loader = DataLoader(Subset(CanvasSamples(reader, cfg), rows), batch_size=len(rows), num_workers=2,
                        collate_fn=collate_samples)
    (batch,) = list(loader)
    views = collate_samples([reader[i] for i in rows])
    assert cfg.main_image_key not in batch and cfg.wrist_image_key not in batch
    assert batch[CANVAS_KEY].shape == (len(rows), cfg.num_frames, 3, cfg.canvas_height, cfg.canvas_width)
    assert batch[CANVAS_KEY].nbytes < 0.5 * (views[cfg.main_image_key].nbytes + views[cfg.wrist_image_key].nbytes)
    assert torch.equal(batch[CANVAS_KEY], policy.processor.canvases(views))
    for key in set(views) - {cfg.main_image_key, cfg.wrist_image_key}:
        assert key in batch and (batch[key] == views[key] if isinstance(views[key], list)
                                 else torch.equal(batch[key], views[key])), key
    for got, want in zip(policy.processor.encode_pixels(batch), policy.processor.encode_pixels(views), strict=True):
        assert torch.equal(got, want)
    gens = lambda: [torch.Generator().manual_seed(5 + i) for i in rows]  # noqa: E731
    torch.testing.assert_close(policy.sft_loss(batch, gens())[0], policy.sft_loss(views, gens())[0], rtol=0, atol=0)
    other = {**batch, CANVAS_KEY: batch[CANVAS_KEY][..., :160, :]}
    with pytest.raises(ValueError, match="composed for another canvas"):
        policy.processor.encode_pixels(other)


def test_the_cache_is_checked_against_what_it_was_made_from(inputs, built) -> None:
    assert lc.check_cache(built, _key(inputs)) is True
    other_stats = inputs["root"] / "other_stats.json"
    stats = json.loads(Path(inputs["stats"]).read_text())
    stats["global_raw"]["q99"][0] += 0.1
    other_stats.write_text(json.dumps(stats))
    cases = {
        "canvas size": _key(inputs, canvas=(256, 320)),
        "VAE dtype": _key(inputs, vae_dtype="bfloat16"),
        "reader settings (data.dataset.*): stats_path": _key(inputs, data={"stats_path": str(other_stats)}),
        "reader settings (data.dataset.*): complete_chunks_only": _key(inputs, data={"complete_chunks_only": True}),
    }
    for what, key in cases.items():
        with pytest.raises(ConfigError, match="data.latent_cache_dir") as err:
            lc.check_cache(built, key)
        assert what in str(err.value) and "another directory" in str(err.value)

    other_model = write_model_dir(inputs["root"] / "other_vae", preset="tiny", seed=1)
    other_vae = lc.cache_key(_data_cfg(inputs), other_model, vae_dtype="float32", canvas=(192, 320),
                             resolution_tier=256)
    with pytest.raises(ConfigError, match="the VAE weights"):
        lc.check_cache(built, other_vae)


def test_a_non_empty_directory_without_a_cache_is_refused(inputs, tmp_path) -> None:
    assert lc.check_cache(tmp_path / "new", _key(inputs)) is False
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        lc.check_cache(tmp_path / "busy", _key(inputs))


def test_an_interrupted_build_leaves_no_cache(inputs, policy, tmp_path) -> None:
    reader = LiberoLeRobotDataset(_data_cfg(inputs))
    calls = {"n": 0}

    def failing(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:  # fault injected: the 2nd batch
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("killed mid-build")
        return policy.processor.encode_pixels(batch)

    cache_dir = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="killed"):
        lc.build_cache(reader, failing, cache_dir, _key(inputs), batch_size=8)
    assert lc.check_cache(cache_dir, _key(inputs)) is False, "nothing that looks like a cache"
    with pytest.raises(FileNotFoundError):
        lc.LatentCacheDataset(cache_dir)


# ----------------------------------------------------------------------------- through the launcher


def _overrides(inputs: dict[str, Path], log_path: Path, cache: Path, *extra: str, model: Path | None = None
               ) -> list[str]:
    return [f"actor.model.model_path={model or inputs['model']}", f"data.dataset.root={inputs['data']}",
            f"data.dataset.stats_path={inputs['stats']}", f"runner.log_path={log_path}",
            f"runner.logs_dir={log_path.parent / 'logs'}", f"data.latent_cache_dir={cache}",
            "runner.max_steps=4", "runner.save_interval=2", "actor.optim.total_training_steps=10",
            "actor.optim.lr_warmup_steps=2", "data.num_workers=0", "data.dataset.complete_chunks_only=false", *extra]


def _losses(run_dir: Path) -> list[float]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [s.value for s in events.Scalars("train/loss")]


@pytest.mark.slow
def test_sft_builds_the_cache_once_reuses_it_and_resumes_exactly(inputs, tmp_path) -> None:
    cache = tmp_path / "latents"
    first = tmp_path / "first"
    first.mkdir()
    proc = subprocess.run(["bash", str(REPO / "examples/sft/run_vla_sft.sh"), "libero_sft_cosmos3_tiny",
                           *_overrides(inputs, first / "ckpts", cache)],
                          cwd=first, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (run_dir,) = list((first / "logs").iterdir())
    log = (run_dir / "run_embodiment.log").read_text()
    assert "none yet: the ranks build it" in log
    assert "encoded 20 samples" in proc.stdout + proc.stderr and "(read by episode)" in proc.stdout + proc.stderr, \
        "each of the 2 ranks encodes one whole episode"
    assert lc.read_manifest(cache)["num_samples"] == 2 * FRAMES
    built_at = lc.read_manifest(cache)["created_at"]

    from hydra import compose, initialize_config_dir

    from rlinf_cosmos3.runners.sft_runner import run_sft

    # Resumed from global_step_2 with a wall-time limit: the cache is reused, step 3 is the straight run's step 3
    # exactly, and the limit stops the run cleanly after that step with a checkpoint to resume from.
    second = tmp_path / "second"
    resume = first / "ckpts" / "libero_sft_cosmos3_tiny" / "checkpoints" / "global_step_2"
    with initialize_config_dir(config_dir=str(REPO / "examples/sft/config"), version_base=None):
        cfg = compose("libero_sft_cosmos3_tiny",
                      overrides=_overrides(inputs, second / "ckpts", cache, f"runner.resume_dir={resume}",
                                           "runner.max_wall_time_s=0.001"))
    assert run_sft(cfg, config_name="resumed") == 0
    (resumed_dir,) = list((second / "logs").iterdir())
    log = (resumed_dir / "run_embodiment.log").read_text()
    assert f"latent cache {cache}: reused" in log
    assert lc.read_manifest(cache)["created_at"] == built_at, "reused, not rebuilt"
    assert _losses(resumed_dir) == _losses(run_dir)[2:3]
    assert "runner.max_wall_time_s=0.001 reached after step 3 of 4" in log
    steps = sorted(p.name for p in (second / "ckpts" / "libero_sft_cosmos3_tiny" / "checkpoints").iterdir())
    assert steps == ["global_step_3"]

    # A cache made for another VAE is refused before any rank starts (exit 2, the field named).
    other = write_model_dir(tmp_path / "other_model", preset="tiny", seed=3)
    proc = subprocess.run(["bash", str(REPO / "examples/sft/run_vla_sft.sh"), "libero_sft_cosmos3_tiny",
                           *_overrides(inputs, tmp_path / "third" / "ckpts", cache, model=other)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "data.latent_cache_dir" in out and "the VAE weights" in out and "starting" not in out
    shutil.rmtree(tmp_path / "third", ignore_errors=True)
