"""The RL chain is conditioned on what the eval conditions the pipeline on: for the same env observations, the
condition latents and prompt ids of :func:`encode_observations` equal what the embedded backend's real
diffusers pipeline uses (tiny Cosmos3, CPU, fp32), in both caption styles. The request is built by the eval's
own adapter; the pipeline's clean latents are read where it cuts their padding off, its prompt ids and
condition frame from the transformer's arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf_cosmos3.config.rollout import RolloutModelConfig
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, PolicyConfig
from rlinf_cosmos3.rl.observation_encoding import EncodedObservations, encode_observations
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.embedded import EmbeddedPolicyWorker

TASKS = ["pick up the black bowl ", "put the mug on the plate", "pick up the black bowl "]


def observations(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n = len(TASKS)
    return {"main_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "task_descriptions": list(TASKS)}


def served(model: Path, stats: Path, style: str, obs: dict[str, Any]) -> dict[str, Any]:
    """What the embedded backend's pipeline uses for the adapter's request: per observation the clean latents
    (after the padding cut), the prompt ids and the condition frame handed to the transformer."""
    cfg = RolloutModelConfig(model_path=str(model), action_stats_path=str(stats), action_normalization="quantile_rot",
                             num_inference_steps=1, caption_style=style)
    adapter = Cosmos3ActionAdapter(cfg, batching_max_size=8)
    (group,) = adapter.request_groups(obs, by_prompt_length=False)
    assert group.env_indices.tolist() == list(range(len(TASKS)))
    worker = EmbeddedPolicyWorker(str(model), "fp32", style)
    pipe = worker.pipe
    latents: list[torch.Tensor] = []
    calls: list[dict[str, Any]] = []
    cut = pipe._remove_action_video_padding_from_latent

    def spy(x: torch.Tensor, image_size: torch.Tensor) -> torch.Tensor:
        out = cut(x, image_size)
        latents.append(out.detach().clone())
        return out

    pipe._remove_action_video_padding_from_latent = spy
    handle = pipe.transformer.register_forward_pre_hook(lambda _m, _a, kw: calls.append(dict(kw)), with_kwargs=True)
    try:
        worker.generate(adapter.build_request(group))
    finally:
        handle.remove()
    assert len(latents) == len(calls) == len(TASKS)  # one step, guidance 1.0: one call per observation
    return {"canvases": group.images, "latents": latents, "input_ids": [c["input_ids"].tolist() for c in calls],
            "condition": [c["vision_tokens"][0][:, :, 0] for c in calls]}


@pytest.fixture(scope="module", params=["diffusers", "cosmos_framework"])
def both(request: pytest.FixtureRequest, tiny_model_and_stats) -> dict[str, Any]:
    style = request.param
    model, stats = Path(tiny_model_and_stats.model), Path(tiny_model_and_stats.stats)
    policy = Cosmos3Policy.from_pretrained(model, PolicyConfig(caption_style=style))
    obs = observations()
    ours = encode_observations(policy, obs["main_images"], obs["wrist_images"], obs["task_descriptions"])
    alone = [encode_observations(policy, obs["main_images"][i:i + 1], obs["wrist_images"][i:i + 1],
                                 obs["task_descriptions"][i:i + 1]) for i in range(len(TASKS))]
    return {"ours": ours, "alone": alone, "theirs": served(model, stats, style, obs), "style": style,
            "policy": policy}


def test_prompt_ids_are_the_served_caption(both: dict[str, Any]) -> None:
    ours: EncodedObservations = both["ours"]
    assert ours.input_ids == both["theirs"]["input_ids"]
    assert ours.input_ids[0] == ours.input_ids[2] != ours.input_ids[1]
    text = both["policy"].pipeline.text_tokenizer.decode(ours.input_ids[1])
    assert '"description": "put the mug on the plate' in text and "system" not in text
    assert ('"idle_frame": "0 out of 16."' in text) == (both["style"] == "cosmos_framework")


def test_condition_latents_are_the_pipelines(both: dict[str, Any]) -> None:
    """The canvas, and the condition latent: that of the pipeline's canvas held over the clip and the frame 0 the
    transformer gets, bit for bit for one observation; up to the VAE's batching for several."""
    ours: EncodedObservations = both["ours"]
    theirs = both["theirs"]
    np.testing.assert_array_equal(ours.canvases, theirs["canvases"])
    assert ours.latents.dtype == torch.float32 and ours.latents.shape == (len(TASKS), 48, 5, 12, 20)
    assert float(ours.latents[:, :, 1:].abs().max()) == 0.0  # never read: the chain starts them from noise
    for i, alone in enumerate(both["alone"]):
        assert alone.latents.shape == theirs["latents"][i].shape
        held = theirs["latents"][i][:, :, 0].float()
        torch.testing.assert_close(alone.latents[:, :, 0], held, rtol=0, atol=0)
        torch.testing.assert_close(alone.latents[0, :, 0], theirs["condition"][i][0].float(), rtol=0, atol=0)
        torch.testing.assert_close(ours.latents[i:i + 1, :, 0], held, rtol=1e-5, atol=1e-5)
        assert alone.input_ids == ours.input_ids[i:i + 1]
