"""The ``cosmos_framework`` caption style and the flow shift through the real pieces, on a tiny Cosmos3.

A real LeRobot v3 dataset holds the 40-frame demo of tests/data/parity_reference.json (the episode
cosmos-framework's own ``LIBEROLeRobotDataset`` captioned, see tests/data/make_parity_reference.py);
the real reader, the real latent cache, the real diffusers pipeline (tokenizer, transformer) and the
embedded backend's worker class, in this process, produce the token ids the transformer sees. The
ids are decoded back to text and compared with the caption NVIDIA's code wrote, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf_cosmos3.actions import compute_action_stats, write_action_stats
from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset, collate_samples
from rlinf_cosmos3.data import latent_cache as lc
from rlinf_cosmos3.models.cosmos3.captions import eval_request_text
from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.workers.rollout.embedded import EmbeddedPolicyWorker
from rlinf_cosmos3.workers.rollout.protocol import SamplingSettings, build_payload

REF = json.loads((Path(__file__).parent / "data" / "parity_reference.json").read_text())
TASK = REF["training_captions"][0]["task"]  # one paraphrase only: the caption is fully determined
STARTS = sorted({r["start"] for r in REF["training_captions"]})
SIZE = 32  # small stored frames: only captions and actions matter here
CHAT_PREFIX, CHAT_SUFFIX = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<|im_end|><|vision_start|>"


def _write_dataset(root: Path, actions: np.ndarray, task: str) -> Path:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features: dict[str, dict] = {
        key: {"dtype": "image", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channel"]}
        for key in ("observation.images.image", "observation.images.wrist_image")}
    features["observation.state"] = {"dtype": "float32", "shape": (8,), "names": None}
    features["action"] = {"dtype": "float32", "shape": (7,), "names": None}
    ds = LeRobotDataset.create("test/parity", fps=REF["fps"], features=features, root=root, use_videos=False)
    rng = np.random.default_rng(0)
    for action in actions:
        frame: dict[str, Any] = {key: rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
                                 for key in features if key.startswith("observation.images")}
        frame["observation.state"] = rng.normal(size=8).astype(np.float32)
        frame["action"] = action.astype(np.float32)
        frame["task"] = task
        ds.add_frame(frame)
    ds.save_episode(parallel_encoding=False)
    ds.finalize()
    return root


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parity_pipeline")
    actions = np.array(REF["demo_actions"])
    stats = compute_action_stats([actions], metadata={"fps": REF["fps"]})
    return {"root": root, "data": _write_dataset(root / "demo", actions, TASK),
            "short": _write_dataset(root / "short", actions[12:32], TASK),
            "stats": write_action_stats(stats, root / "stats.json"),
            "model": write_model_dir(root / "tiny", preset="tiny", seed=0)}


def _data_cfg(inputs: dict[str, Path], which: str = "data", **extra: Any) -> LiberoDataConfig:
    """Every frame starts a sample unless a test asks for complete windows (the padded tail is compared too)."""
    return LiberoDataConfig(root=str(inputs[which]), repo_id="test/parity", stats_path=str(inputs["stats"]),
                            image_size=[SIZE, SIZE], **{"complete_chunks_only": False, **extra})


@pytest.fixture(scope="module")
def reader(inputs: dict[str, Path]) -> LiberoLeRobotDataset:
    return LiberoLeRobotDataset(_data_cfg(inputs))


def _reference_caption(start: int) -> dict:
    return next(r for r in REF["training_captions"] if r["task"] == TASK and r["start"] == start)


def test_reader_counts_idle_frames_as_nvidia(reader: LiberoLeRobotDataset) -> None:
    for start in STARTS:
        sample = reader[start]
        assert int(sample["frame_index"]) == start
        assert int(sample["idle_frames"]) == _reference_caption(start)["idle_frames"], start


def test_training_prompts_nvidias_caption(inputs: dict[str, Path], reader: LiberoLeRobotDataset) -> None:
    policy = Cosmos3Policy.from_pretrained(inputs["model"], PolicyConfig(caption_style="cosmos_framework"))
    batch = collate_samples([reader[s] for s in STARTS])
    generators = [torch.Generator().manual_seed(i) for i in range(len(STARTS))]
    tokenizer = policy.pipeline.text_tokenizer
    for i, start in enumerate(STARTS):
        ids, uncond = policy.processor.sample_ids(batch, i, generators[i])
        assert tokenizer.decode(ids) == CHAT_PREFIX + _reference_caption(start)["caption"] + CHAT_SUFFIX
        assert tokenizer.decode(uncond) == CHAT_PREFIX + CHAT_SUFFIX  # caption dropout: the empty prompt

    # The default style is untouched: diffusers' own caption, which our verbatim path reproduces exactly.
    default = Cosmos3Policy.from_pretrained(inputs["model"])
    ids = default.processor.sample_ids(batch, 0, generators[0])
    assert ids == default.processor.prompt_ids(TASK)
    diffusers_caption = default.pipeline._build_action_json_prompt(TASK, view_point="concat_view", num_frames=17,
                                                                   fps=20.0, height=192, width=320)
    assert '"idle_frame"' not in diffusers_caption
    assert default.processor.caption_ids(diffusers_caption) == ids


def test_paraphrase_draws_do_not_depend_on_how_the_batch_is_split(inputs: dict[str, Path]) -> None:
    """Per-sample generators (seeded by run seed, step, dataset index) decide the paraphrase, not batch places."""
    from rlinf_cosmos3.models.cosmos3.processor import LATENT_KEY, LATENT_VALID_KEY

    policy = Cosmos3Policy.from_pretrained(inputs["model"], PolicyConfig(caption_style="cosmos_framework"))
    task = next(t for t, v in REF["paraphrases"].items() if len(v) > 1)
    n = 8
    batch = {LATENT_KEY: torch.zeros(n, 48, 5, 12, 20), LATENT_VALID_KEY: torch.ones(n, 5, dtype=torch.bool),
             "actions": torch.zeros(n, 16, 10), "prompt": [task] * n, "idle_frames": torch.full((n,), 3)}

    def generators() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(1000 + k) for k in range(n)]

    whole = [s.input_ids for s in policy.encode_batch(batch, generators())]
    split = []
    for part in (slice(0, 3), slice(3, n)):
        piece = {key: value[part] for key, value in batch.items()}
        split += [s.input_ids for s in policy.encode_batch(piece, generators()[part])]
    assert split == whole
    texts = {policy.pipeline.text_tokenizer.decode(ids) for ids in whole}
    assert len(texts) > 1 and all('"idle_frame": "3 out of 16."' in t for t in texts)


@pytest.mark.slow
def test_latent_cache_keeps_the_idle_frames(inputs: dict[str, Path]) -> None:
    data = _data_cfg(inputs, "short", complete_chunks_only=True)
    short = LiberoLeRobotDataset(data)
    assert len(short) == 4
    key = lc.cache_key(data, inputs["model"], vae_dtype="float32", canvas=(192, 320), resolution_tier=256)
    encoder = Cosmos3Policy.from_pretrained(inputs["model"]).processor.encode_pixels
    cache = lc.build_cache(short, encoder, inputs["root"] / "cache", key, batch_size=4)
    cached = lc.LatentCacheDataset(cache)
    counts = [int(cached[i]["idle_frames"]) for i in range(len(cached))]
    assert counts == [int(short[i]["idle_frames"]) for i in range(len(short))]
    assert len(set(counts)) > 1  # the chunks differ, so a wrong row would show


# ----------------------------------------------------------------------------- serving


class _Capture:
    """Forward pre-hook recording the transformer's keyword arguments (observing, not changing them)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls: list[dict[str, Any]] = []
        self._handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self.calls.append(dict(kwargs))

    def close(self) -> None:
        self._handle.remove()


def _payload(task_text: str, flow_shift: float) -> dict[str, Any]:
    settings = SamplingSettings(domain_name="libero", raw_action_dim=10, action_horizon=16, num_inference_steps=2,
                                height=192, width=320, fps=20, seed=0, guidance_scale=1.0, view_point="concat_view",
                                flow_shift=flow_shift)
    images = np.random.default_rng(1).integers(0, 256, (1, 192, 320, 3), dtype=np.uint8)
    return build_payload(images, [task_text], settings)


def _served_text(worker: EmbeddedPolicyWorker, payload: dict[str, Any]) -> tuple[str, np.ndarray]:
    capture = _Capture(worker.pipe.transformer)
    try:
        actions = worker.generate(payload)
    finally:
        capture.close()
    assert len(capture.calls) == 2  # 2 steps, guidance 1.0: no unconditional pass
    return worker.pipe.text_tokenizer.decode(capture.calls[0]["input_ids"].tolist()), actions


def test_embedded_backend_prompts_with_nvidias_eval_caption(inputs: dict[str, Path]) -> None:
    ref = next(r for r in REF["eval_captions"] if r["task"] == TASK)
    worker = EmbeddedPolicyWorker(str(inputs["model"]), "fp32", "cosmos_framework")
    text, actions = _served_text(worker, _payload(eval_request_text("cosmos_framework", TASK), 5.0))
    assert text == CHAT_PREFIX + ref["caption"] + CHAT_SUFFIX
    assert actions.shape == (1, 16, 10) and np.isfinite(actions).all()


def test_embedded_backend_samples_with_the_requests_flow_shift(inputs: dict[str, Path]) -> None:
    worker = EmbeddedPolicyWorker(str(inputs["model"]), "fp32")
    assert worker.pipe.scheduler.config.flow_shift == 5.0  # what the tiny model's scheduler_config.json says
    text, at_5 = _served_text(worker, _payload(TASK, 5.0))
    assert '"description": "' + TASK + '."' in text and '"idle_frame"' not in text  # diffusers' caption
    _, at_3 = _served_text(worker, _payload(TASK, 3.0))
    scheduler = worker.pipe.scheduler
    assert scheduler.config.flow_shift == 3.0
    scheduler.set_timesteps(4)
    base = np.linspace(1, 1 / 1000, 5)[:-1]
    np.testing.assert_allclose(scheduler.sigmas[:4].numpy(), 3 * base / (1 + 2 * base) - np.array([1e-6, 0, 0, 0]),
                               rtol=1e-6)
    assert not np.allclose(at_3, at_5)
    worker.pipe.use_flow_shift(5.0)  # what the next request with 5.0 does first
    assert worker.pipe.scheduler.config.flow_shift == 5.0
