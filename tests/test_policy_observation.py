"""The composed policy image is what diffusers' pipeline would build, and the pipeline leaves it as it is.

Runs the real diffusers 0.42.1 preprocessing (``_prepare_action_video_conditioning`` of a
pipeline loaded from a tiny random Cosmos3 directory).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diffusers import Cosmos3OmniPipeline
from PIL import Image

from rlinf_cosmos3.models.cosmos3.observation import (
    CANVAS_HEIGHT,
    CANVAS_WIDTH,
    canvas_layout,
    compose_observation,
)
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Cosmos3OmniPipeline:
    model_dir = write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)
    return Cosmos3OmniPipeline.from_pretrained(model_dir, enable_safety_checker=False)


def _smooth_views(seed: int, frames: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Two ``[frames, 256, 256, 3]`` uint8 views of smooth random content (no bicubic overshoot to clip)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(2 * frames, 3, 8, 8, generator=g) * 200 + 27
    fine = F.interpolate(coarse, size=(256, 256), mode="bilinear", align_corners=False)
    views = fine.round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return views[:frames], views[frames:]


def test_layout_of_two_libero_views() -> None:
    layout = canvas_layout(256, 512, CANVAS_HEIGHT, CANVAS_WIDTH)
    assert (layout.content_height, layout.content_width, layout.pad_bottom, layout.pad_right) == (160, 320, 32, 0)
    assert layout.pad_mode == "reflect"
    # Never upscaled: a small pair is padded, not stretched; a pad as large as the content repeats the edge.
    small = canvas_layout(64, 128, CANVAS_HEIGHT, CANVAS_WIDTH)
    assert (small.content_height, small.content_width, small.pad_mode) == (64, 128, "replicate")


def test_main_left_wrist_right_content_top_left_reflect_padding() -> None:
    main = np.zeros((256, 256, 3), dtype=np.uint8)
    main[..., 0] = 200  # red
    wrist = np.zeros((256, 256, 3), dtype=np.uint8)
    wrist[..., 2] = 90  # blue
    wrist[-1, :, 1] = 255  # a bright bottom row, to see the reflection
    canvas = compose_observation(main, wrist, channels_last=True)
    assert canvas.shape == (CANVAS_HEIGHT, CANVAS_WIDTH, 3) and canvas.dtype == np.uint8
    assert (canvas[:, :150, 0] == 200).all() and (canvas[:, :150, 2] == 0).all()
    assert (canvas[:, 170:, 2] == 90).all() and (canvas[:, 170:, 0] == 0).all()
    # Rows 160.. mirror the content about its last row (160 + k <- 158 - k), so the bright edge row
    # 159 is not repeated and appears nowhere below it.
    for k in range(32):
        np.testing.assert_array_equal(canvas[160 + k], canvas[158 - k])
    assert canvas[159, 200:, 1].mean() > canvas[160:, 200:, 1].mean() + 20


def test_layouts_and_leading_dims_agree() -> None:
    main, wrist = _smooth_views(0, frames=3)
    hwc = compose_observation(main, wrist, channels_last=True)
    chw = compose_observation(torch.from_numpy(main).permute(0, 3, 1, 2), torch.from_numpy(wrist).permute(0, 3, 1, 2))
    assert isinstance(hwc, np.ndarray) and isinstance(chw, torch.Tensor)
    assert hwc.shape == (3, CANVAS_HEIGHT, CANVAS_WIDTH, 3) and tuple(chw.shape) == (3, 3, CANVAS_HEIGHT, CANVAS_WIDTH)
    np.testing.assert_array_equal(chw.permute(0, 2, 3, 1).numpy(), hwc)
    single = compose_observation(main[1], wrist[1], channels_last=True)
    np.testing.assert_array_equal(single, hwc[1])
    with pytest.raises(ValueError, match="uint8"):
        compose_observation(main.astype(np.float32), wrist.astype(np.float32), channels_last=True)
    with pytest.raises(ValueError, match="differ"):
        compose_observation(main, wrist[:2], channels_last=True)
    with pytest.raises(ValueError, match="RGB"):
        compose_observation(main, wrist)  # HWC data read as CHW


def test_pipeline_fits_the_raw_pair_the_way_we_compose_it(pipe: Cosmos3OmniPipeline) -> None:
    """Given the raw 256x512 pair, diffusers builds our canvas (up to uint8 rounding)."""
    main, wrist = _smooth_views(1, frames=1)
    pair = Image.fromarray(np.concatenate([main[0], wrist[0]], axis=1))
    frames, image_size, height, width = pipe._prepare_action_video_conditioning(
        [pair], 256, 17, device="cpu", dtype=torch.float32
    )
    assert (height, width) == (CANVAS_HEIGHT, CANVAS_WIDTH)
    assert image_size.tolist() == [192.0, 320.0, 160.0, 320.0]
    ours = torch.from_numpy(compose_observation(main[0], wrist[0], channels_last=True)).permute(2, 0, 1)
    ours = ours.to(torch.float32) / 127.5 - 1.0
    theirs = frames[0, :, 0].clamp(-1, 1)
    assert (ours - theirs).abs().max() <= 0.5 / 127.5 + 1e-4


def test_pipeline_leaves_our_canvas_unchanged(pipe: Cosmos3OmniPipeline) -> None:
    """Handed our canvas, the pipeline neither resizes nor pads it: what we compose is what the VAE sees."""
    main, wrist = _smooth_views(2, frames=1)
    canvas = compose_observation(main[0], wrist[0], channels_last=True)
    frames, image_size, height, width = pipe._prepare_action_video_conditioning(
        [Image.fromarray(canvas)], 256, 17, device="cpu", dtype=torch.float32
    )
    assert (height, width) == (CANVAS_HEIGHT, CANVAS_WIDTH)
    assert image_size.tolist() == [192.0, 320.0, 192.0, 320.0]  # no padding to strip from the latents
    expected = torch.from_numpy(canvas).permute(2, 0, 1).to(torch.float32) / 255.0 * 2.0 - 1.0
    assert frames.shape == (1, 3, 17, CANVAS_HEIGHT, CANVAS_WIDTH)
    for t in (0, 16):  # a single observation is repeated over the 17 frames
        torch.testing.assert_close(frames[0, :, t], expected, rtol=0, atol=1e-6)


def test_uint8_arrays_are_misread_by_diffusers(pipe: Cosmos3OmniPipeline) -> None:
    """Why the policy hands diffusers PIL images: a uint8 array is taken as [0, 1] data (0.42.1)."""
    canvas = np.full((CANVAS_HEIGHT, CANVAS_WIDTH, 3), 255, dtype=np.uint8)
    frames, *_ = pipe._prepare_action_video_conditioning([canvas], 256, 17, device="cpu", dtype=torch.float32)
    assert frames.max() > 100  # 2 * 255 - 1, not 1.0
    frames, *_ = pipe._prepare_action_video_conditioning(
        [Image.fromarray(canvas)], 256, 17, device="cpu", dtype=torch.float32
    )
    assert frames.max() == 1.0



def test_policy_condition_hands_diffusers_pil_images() -> None:
    """Every caller of policy_condition (embedded backend, tests) gets the safe conversion."""
    from rlinf_cosmos3.models.cosmos3.action_condition import policy_condition

    canvas = np.full((CANVAS_HEIGHT, CANVAS_WIDTH, 3), 255, dtype=np.uint8)
    assert isinstance(policy_condition(canvas).image, Image.Image)
    assert isinstance(policy_condition(torch.from_numpy(canvas)).image, Image.Image)
    as_float = torch.ones(3, CANVAS_HEIGHT, CANVAS_WIDTH)
    assert policy_condition(as_float).image is as_float
