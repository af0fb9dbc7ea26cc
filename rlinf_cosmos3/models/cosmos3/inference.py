"""One observation's action chunk through the diffusers pipeline, the way every in-process path asks for it.

Two callers run the pipeline themselves instead of asking SGLang: the embedded rollout backend (a Ray
actor serving eval requests) and :meth:`Cosmos3Policy.predict` (open-loop checks on training frames).
They must sample the same thing for the same observation, or an open-loop error would describe
another policy than the one evaluated. So both build their call here: a policy condition from the
composed ``[main | wrist]`` canvas, the diffusers or NVIDIA eval caption, the sampler's flow shift, no
system prompt, and a generator on the pipeline's device seeded by the caller.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from rlinf_cosmos3.models.cosmos3.action_condition import policy_condition
from rlinf_cosmos3.models.cosmos3.captions import cosmos_framework_eval_caption


def predict_actions(
    pipeline: Any,
    canvas: Any,
    prompt: str,
    *,
    seed: int,
    domain_name: str,
    action_horizon: int,
    view_point: str,
    num_frames: int,
    fps: float,
    num_inference_steps: int,
    guidance_scale: float = 1.0,
    resolution_tier: int = 256,
    caption_style: str = "diffusers",
    flow_shift: float | None = None,
) -> torch.Tensor:
    """Normalised ``[horizon, raw_action_dim]`` actions for one composed canvas (uint8 ``[H, W, 3]`` or PIL).

    ``pipeline`` is a :class:`~rlinf_cosmos3.models.cosmos3.captioned_pipeline.CaptionedCosmos3Pipeline`;
    ``flow_shift`` (None: the scheduler's own) is what SGLang is sent per request; ``caption_style``
    ``cosmos_framework`` prompts with NVIDIA's eval caption verbatim.
    """
    if flow_shift is not None:
        pipeline.use_flow_shift(float(flow_shift))
    condition = policy_condition(canvas, domain_name=domain_name, chunk_size=action_horizon,
                                 resolution_tier=resolution_tier, view_point=view_point)
    caption = None
    if caption_style == "cosmos_framework":
        height, width = _canvas_size(canvas)
        caption = cosmos_framework_eval_caption(prompt, action_horizon=action_horizon, num_frames=num_frames,
                                                fps=fps, height=height, width=width)
    generator = torch.Generator(device=pipeline.device).manual_seed(int(seed))
    with torch.inference_mode(), (pipeline.verbatim_caption(caption) if caption is not None
                                  else contextlib.nullcontext()):
        out = pipeline(prompt=prompt, action=condition, num_inference_steps=int(num_inference_steps),
                       guidance_scale=float(guidance_scale), fps=float(fps), generator=generator,
                       output_type="latent", use_system_prompt=False)
    return out.action[0]


def _canvas_size(canvas: Any) -> tuple[int, int]:
    """(height, width) of a uint8 ``[H, W, 3]`` array/tensor or a PIL image."""
    if hasattr(canvas, "shape"):
        return int(canvas.shape[0]), int(canvas.shape[1])
    width, height = canvas.size
    return int(height), int(width)
