"""The policy's conditioning image: main and wrist views side by side, fitted into the model canvas.

One function, :func:`compose_observation`, builds it for training (all 17 frames of a chunk) and
for evaluation (the current observation), so both see the same pixels.

Why we compose the canvas ourselves instead of handing the raw 256x512 pair to the backend: the
two serving paths treat a non-canvas image differently.

* diffusers (``Cosmos3OmniPipeline._prepare_action_video_conditioning``, 0.42.1) picks the
  ``resolution_tier`` bin closest to the input aspect (256x512 -> 192x320), shrinks the input to
  fit without upscaling (bicubic, antialiased) and reflect-pads bottom/right;
* SGLang (``Cosmos3`` image preprocessing, 0.5.23) scales the input to *cover* the requested
  ``height x width`` and centre-crops it, which would cut 32 columns off each side.

Given an image that already has the canvas size, both do nothing to it: diffusers' bin is the
input size (scale 1, no padding) and SGLang's cover-scale is 1 (no resize, no crop). So we fit and
pad here, exactly as diffusers and NVIDIA's training (``reflection_pad_to_target`` in
cosmos-framework ``data/generator/action/utils/transforms.py``) do it:

* layout: ``[main | wrist]`` along the width (cosmos-framework ``concat_view``: third-person view
  left, wrist view right);
* fit: scale ``s = min(W / (2 w), H / h, 1)``, content ``round(s h) x round(s w)``, bicubic with
  antialiasing (two 256x256 views -> 160x320 content in a 192x320 canvas);
* where the image sits: content at the top-left corner, rows ``[0, content_h)`` and columns
  ``[0, content_w)``;
* padding value: no constant - the padded rows/columns *reflect* the content (row
  ``content_h + k`` copies row ``content_h - 2 - k``), or repeat the edge when the pad is at least
  as large as the content (torch ``reflect``/``replicate`` modes, the same rule as diffusers and
  NVIDIA);
* output: uint8, rounded and clamped, as the SGLang request carries it.

The canvas, padding included, is what the model sees: training encodes and supervises all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rlinf_cosmos3.config.model_settings import RECIPE

CANVAS_HEIGHT = RECIPE.canvas_height
CANVAS_WIDTH = RECIPE.canvas_width
"""The 256-tier canvas for a 2:1 side-by-side LIBERO observation (reference eval config)."""

VIEW_POINT = RECIPE.view_point
"""Framing sentence of the action caption for a side-by-side two-camera image (diffusers and
SGLang both take it: ``CosmosActionCondition.view_point`` / request ``action_view_point``).
Training and serving must use the same value."""


@dataclass(frozen=True)
class CanvasLayout:
    """Where the side-by-side content lands in the canvas."""

    height: int
    width: int
    content_height: int
    content_width: int

    @property
    def pad_bottom(self) -> int:
        return self.height - self.content_height

    @property
    def pad_right(self) -> int:
        return self.width - self.content_width

    @property
    def pad_mode(self) -> str:
        """Reflect unless the pad is at least the content size (then repeat the edge)."""
        if self.pad_right >= self.content_width or self.pad_bottom >= self.content_height:
            return "replicate"
        return "reflect"


def canvas_layout(source_height: int, source_width: int, height: int, width: int) -> CanvasLayout:
    """Fit a ``source_height x source_width`` image into the canvas without upscaling."""
    scale = min(width / source_width, height / source_height, 1.0)
    content_h = max(1, int(scale * source_height + 0.5))
    content_w = max(1, int(scale * source_width + 0.5))
    return CanvasLayout(height, width, content_h, content_w)


def compose_observation(
    main: torch.Tensor | np.ndarray,
    wrist: torch.Tensor | np.ndarray,
    *,
    height: int = CANVAS_HEIGHT,
    width: int = CANVAS_WIDTH,
    channels_last: bool = False,
) -> torch.Tensor | np.ndarray:
    """Side-by-side ``[main | wrist]`` uint8 views -> uint8 canvas ``height x width``.

    Takes ``[..., 3, h, w]`` (``channels_last=False``, the dataset layout) or ``[..., h, w, 3]``
    (``channels_last=True``, the simulator layout) with any leading dims (frames, envs), and returns
    the same layout and array type. Both views must have the same shape.
    """
    as_numpy = isinstance(main, np.ndarray)
    # Arrays from Ray's object store are read-only and torch warns on those: copy them.
    main_t, wrist_t = (torch.as_tensor(np.array(v) if isinstance(v, np.ndarray) and not v.flags.writeable else v)
                       for v in (main, wrist))
    if main_t.shape != wrist_t.shape:
        raise ValueError(f"main view {tuple(main_t.shape)} and wrist view {tuple(wrist_t.shape)} differ")
    if main_t.dtype != torch.uint8 or wrist_t.dtype != torch.uint8:
        raise ValueError(f"views must be uint8, got {main_t.dtype} and {wrist_t.dtype}")
    channel_dim = -1 if channels_last else -3
    if main_t.ndim < 3 or main_t.shape[channel_dim] != 3:
        layout = "[..., h, w, 3]" if channels_last else "[..., 3, h, w]"
        raise ValueError(f"views must be RGB {layout}, got {tuple(main_t.shape)}")
    if channels_last:
        main_t, wrist_t = main_t.movedim(-1, -3), wrist_t.movedim(-1, -3)

    pair = torch.cat([main_t, wrist_t], dim=-1)  # [..., 3, h, 2w]
    lead = pair.shape[:-3]
    frames = pair.reshape(-1, *pair.shape[-3:]).to(torch.float32)
    layout = canvas_layout(frames.shape[-2], frames.shape[-1], height, width)
    if (layout.content_height, layout.content_width) != tuple(frames.shape[-2:]):
        frames = F.interpolate(
            frames,
            size=(layout.content_height, layout.content_width),
            mode="bicubic",
            align_corners=False,
            antialias=True,
        )
    if layout.pad_bottom or layout.pad_right:
        frames = F.pad(frames, (0, layout.pad_right, 0, layout.pad_bottom), mode=layout.pad_mode)
    canvas = frames.round().clamp(0, 255).to(torch.uint8).reshape(*lead, 3, height, width)
    if channels_last:
        canvas = canvas.movedim(-3, -1).contiguous()
    return canvas.numpy() if as_numpy else canvas
