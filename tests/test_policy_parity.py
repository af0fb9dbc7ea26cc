"""Training builds the transformer call the diffusers pipeline builds at inference, for the same observation.

What the pipeline passes is captured with a forward pre-hook on the real transformer while
``Cosmos3Policy.predict`` runs the real ``Cosmos3OmniPipeline`` (policy mode, no system prompt,
guidance 1.0, as SGLang serves). Everything runs on a tiny random Cosmos3 on CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf_cosmos3.models.cosmos3.observation import VIEW_POINT
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, EncodedSample, sample_sigma
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

PROMPT = "put the black bowl on the plate"


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Cosmos3Policy:
    model_dir: Path = write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)
    return Cosmos3Policy.from_pretrained(model_dir)


def _batch(seed: int) -> dict[str, Any]:
    """One training sample whose first frame is the observation handed to the pipeline."""
    g = torch.Generator().manual_seed(seed)
    return {
        "image": torch.randint(0, 256, (1, 17, 3, 256, 256), dtype=torch.uint8, generator=g),
        "wrist_image": torch.randint(0, 256, (1, 17, 3, 256, 256), dtype=torch.uint8, generator=g),
        "actions": torch.rand(1, 16, 10, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(1, 16, dtype=torch.bool),
        "frame_is_pad": torch.zeros(1, 17, dtype=torch.bool),
        "prompt": [PROMPT],
    }


class _Capture:
    """Forward pre-hook that records every call's keyword arguments (observing, not changing them)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls: list[dict[str, Any]] = []
        self._handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        assert not args, "the pipeline calls the transformer with keywords only"
        self.calls.append(dict(kwargs))

    def close(self) -> None:
        self._handle.remove()


def _assert_same(name: str, ours: Any, theirs: Any) -> None:
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), name
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (name, ours.dtype, theirs.dtype)
        assert torch.equal(ours, theirs), name
    elif isinstance(theirs, list | tuple):
        assert isinstance(ours, list | tuple) and len(ours) == len(theirs), name
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _assert_same(f"{name}[{i}]", a, b)
    else:
        assert ours == theirs, (name, ours, theirs)


@pytest.fixture(scope="module")
def inference_and_training(policy: Cosmos3Policy) -> tuple[dict[str, Any], EncodedSample]:
    batch = _batch(0)
    capture = _Capture(policy.transformer)
    try:
        main = batch["image"][0, 0].permute(1, 2, 0).numpy()
        wrist = batch["wrist_image"][0, 0].permute(1, 2, 0).numpy()
        action = policy.predict(main, wrist, PROMPT, seed=0, num_inference_steps=2)
    finally:
        capture.close()
    assert action.shape == (16, 10) and torch.isfinite(action).all()
    assert len(capture.calls) == 2, "guidance 1.0: one conditional transformer call per step, no CFG pass"
    (sample,) = policy.encode_batch(batch)
    return capture.calls[0], sample


def test_same_sequence_as_the_pipeline(
    policy: Cosmos3Policy, inference_and_training: tuple[dict[str, Any], EncodedSample]
) -> None:
    """Same noisy state and timestep in -> every transformer argument equal, ids and mRoPE positions included."""
    captured, sample = inference_and_training
    noisy_vision = captured["vision_tokens"][0]
    noisy_action = captured["action_tokens"][0]
    timestep = captured["vision_timesteps"][0].item()  # diffusers' UniPC hands integer timesteps
    ours = policy.transformer_inputs(sample.input_ids, noisy_vision, noisy_action, timestep)
    passed = {k: v for k, v in captured.items() if v is not None and k != "return_dict"}  # sound: None
    assert sorted(ours) == sorted(passed)
    for key, value in passed.items():
        _assert_same(key, ours[key], value)

    # What was compared is the policy layout: [text | 5 latent frames of 6x10 patches | 16 actions].
    und_len = captured["und_len"]
    assert captured["sequence_length"] == und_len + 5 * 6 * 10 + 16
    assert captured["vision_noisy_frame_indexes"][0].tolist() == [1, 2, 3, 4]
    assert captured["action_noisy_frame_indexes"][0].tolist() == list(range(16))
    assert captured["action_domain_ids"][0].tolist() == [5]
    assert captured["position_ids"].dtype == torch.float32  # fps-modulated mRoPE positions


def test_prompt_is_the_serving_caption(
    policy: Cosmos3Policy, inference_and_training: tuple[dict[str, Any], EncodedSample]
) -> None:
    """Chat template with no system turn, the action JSON caption for 17 frames at 20 FPS on 192x320."""
    captured, sample = inference_and_training
    assert sample.input_ids == captured["input_ids"].tolist()
    text = policy.pipeline.text_tokenizer.decode(sample.input_ids)
    assert text.startswith("<|im_start|>user\n{") and "system" not in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n<|im_end|><|vision_start|>")
    for fragment in (
        '"framing": "This video contains concatenated views from multiple camera perspectives."',
        '"description": "put the black bowl on the plate."',
        '"fps": 20.0',
        '"resolution": {"H": 192, "W": 320}',
        '"aspect_ratio": "16,9"',
        '"duration": "0s"',
    ):
        assert fragment in text, fragment
    assert VIEW_POINT == "concat_view"


def test_clean_condition_frame_is_the_inference_latent(
    inference_and_training: tuple[dict[str, Any], EncodedSample],
) -> None:
    """Training encodes 17 real frames, inference 17 copies of one: latent frame 0 is the same, bit for bit
    (the Wan VAE is causal in time), and it is what the pipeline feeds as the clean condition."""
    captured, sample = inference_and_training
    assert sample.x0_vision.shape == captured["vision_tokens"][0].shape == (1, 48, 5, 12, 20)
    assert torch.equal(sample.x0_vision[:, :, 0], captured["vision_tokens"][0][:, :, 0])
    # The later latent frames do depend on the future frames (they are what training supervises).
    assert not torch.equal(sample.x0_vision[:, :, 1], captured["vision_tokens"][0][:, :, 1])


def test_loss_path_feeds_the_same_layout(
    policy: Cosmos3Policy, inference_and_training: tuple[dict[str, Any], EncodedSample]
) -> None:
    """The loss calls the transformer with that layout: clean frame 0, noisy frames at sigma, t = 1000 sigma."""
    captured, sample = inference_and_training
    capture = _Capture(policy.transformer)
    try:
        policy.loss_from_encoded([sample], torch.Generator().manual_seed(7))
    finally:
        capture.close()
    (call,) = capture.calls
    for key in ("input_ids", "position_ids", "vision_mse_loss_indexes", "action_mse_loss_indexes", "und_len"):
        _assert_same(key, call[key], captured[key])
    sigma = sample_sigma("waver", 3.0, torch.Generator().manual_seed(7))
    assert 0.0 < float(sigma) < 1.0
    for key in ("vision_timesteps", "action_timesteps"):  # continuous in training (NVIDIA), float32
        assert torch.equal(call[key], torch.full(captured[key].shape, float(sigma) * 1000)), key
    tokens = call["vision_tokens"][0]
    assert torch.equal(tokens[:, :, 0], sample.x0_vision[:, :, 0])
    assert not torch.equal(tokens[:, :, 1:], sample.x0_vision[:, :, 1:])
    action_tokens = call["action_tokens"][0]
    assert action_tokens.shape == (16, 64)
    assert (action_tokens[:, 10:] == 0).all() and (action_tokens[:, :10] != 0).all()


def test_predict_is_reproducible(policy: Cosmos3Policy) -> None:
    rng = np.random.default_rng(1)
    main = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    wrist = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    first = policy.predict(main, wrist, PROMPT, seed=3, num_inference_steps=2)
    again = policy.predict(main, wrist, PROMPT, seed=3, num_inference_steps=2)
    assert torch.equal(first, again)
