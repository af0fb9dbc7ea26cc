"""The action request both backends consume and the response shapes SGLang returns.

A request is SGLang's ``POST /v1/actions/generations`` payload (docs/rollout.md, "The adapter"). The embedded
diffusers backend reads the very same dict, so both backends see the same images, prompts, steps,
seed, guidance and flow shift by construction. Every sampling parameter is always sent: the server's
defaults (480x832, fps 5, 35 steps, seed 42, flow shift 10 for action requests) differ from a LIBERO
model's settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from rlinf_cosmos3.models.cosmos3.domains import get_action_domain

if TYPE_CHECKING:
    from rlinf_cosmos3.config.rollout import RolloutModelConfig

EPISODE_CONTEXT = "episode"
"""Optional payload key: per row the ``task_ids``, ``init_state_ids`` and ``steps`` (policy steps so far)
of the observation's episode, and ``init_state_task_ids`` (whose init state it started from). Added by the adapter only for a backend with ``needs_episode_context``
(the model-free ``replay`` backend); SGLang's and the embedded backend's payloads never carry it."""


SAMPLING_CONFIG_KEYS = {"action_horizon": "num_action_chunks"}
""":class:`SamplingSettings` field -> the ``rollout.model`` field it is read from, where the names differ
(every other field has the name of its config field)."""


@dataclass(frozen=True)
class SamplingSettings:
    """Per-request parameters: the model's settings (domain, widths, horizon, canvas, fps, view point) and
    the serving choices (steps, seed, guidance, flow shift), as ``rollout.model`` sets them (:meth:`of`)."""

    domain_name: str
    raw_action_dim: int
    action_horizon: int
    num_inference_steps: int
    height: int
    width: int
    fps: int
    seed: int
    guidance_scale: float
    view_point: str
    flow_shift: float

    @classmethod
    def of(cls, model_cfg: RolloutModelConfig) -> SamplingSettings:
        """Every field read from its ``rollout.model`` field (:data:`SAMPLING_CONFIG_KEYS`), so a parameter
        added here is sent as configured without a hand mapping to keep in step."""
        return cls(**{f.name: getattr(model_cfg, SAMPLING_CONFIG_KEYS.get(f.name, f.name)) for f in fields(cls)})

    @property
    def domain_id(self) -> int:
        return get_action_domain(self.domain_name).domain_id


def build_payload(images: np.ndarray, prompts: Sequence[str], settings: SamplingSettings,
                  response_format: str = "raw") -> dict[str, Any]:
    """One batched policy request: ``images`` ``[B, H, W, 3]`` uint8 canvases, one prompt each."""
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 [B, H, W, 3], got {images.dtype} {images.shape}")
    if images.shape[1:3] != (settings.height, settings.width):
        raise ValueError(f"images are {images.shape[1]}x{images.shape[2]} but the model canvas is "
                         f"{settings.height}x{settings.width}; compose them to the canvas first")
    if len(prompts) != len(images):
        raise ValueError(f"{len(prompts)} prompts for {len(images)} images")
    return {
        "input": {"task": list(prompts), "observation": {"image": np.ascontiguousarray(images)}},
        "parameters": {
            "action_mode": "policy",
            "domain_name": settings.domain_name,
            "domain_id": settings.domain_id,
            "raw_action_dim": settings.raw_action_dim,
            "action_horizon": settings.action_horizon,
            "num_frames": settings.action_horizon + 1,
            "num_inference_steps": settings.num_inference_steps,
            "height": settings.height,
            "width": settings.width,
            "fps": settings.fps,
            "seed": settings.seed,
            "guidance_scale": settings.guidance_scale,
            "action_view_point": settings.view_point,
            "flow_shift": settings.flow_shift,
        },
        "runtime": {"response_format": response_format},
    }


def payload_images(payload: Mapping[str, Any]) -> np.ndarray:
    """``[B, H, W, 3]`` uint8 images of a request built by :func:`build_payload`."""
    images = np.asarray(payload["input"]["observation"]["image"], dtype=np.uint8)
    return images[None] if images.ndim == 3 else images


def payload_prompts(payload: Mapping[str, Any]) -> list[str]:
    task = payload["input"]["task"]
    return [task] if isinstance(task, str) else list(task)


def response_actions(response: Mapping[str, Any], batch_size: int | None = None,
                     parameters: Mapping[str, Any] | None = None) -> np.ndarray:
    """``[B, horizon, D]`` float32 model actions from a raw or envelope response (JSON or msgpack).

    Raw responses for a single image carry ``[horizon, D]`` without a batch axis; envelope items are
    ordered by ``input_index``. ``batch_size`` is checked when given; so are the ``domain_id`` and
    ``raw_action_dim`` the server reports against the request's ``parameters`` (a server answering
    for another domain or width is a wiring error, not noise).
    """
    if "actions" in response:
        actions = np.asarray(response["actions"], dtype=np.float32)
        if actions.ndim == 2:
            actions = actions[None]
        reports = [response]
    elif "data" in response:
        items = sorted(response["data"], key=lambda item: item["input_index"])
        if [item["input_index"] for item in items] != list(range(len(items))):
            raise ValueError(f"envelope input indexes are not 0..{len(items) - 1}")
        actions = np.stack([np.asarray(item["action"]["values"], dtype=np.float32) for item in items])
        reports = [item["action"] for item in items]
    else:
        raise ValueError(f"response has neither 'actions' (raw) nor 'data' (envelope): keys {sorted(response)}")
    if actions.ndim != 3:
        raise ValueError(f"expected actions [B, horizon, D], got shape {actions.shape}")
    if batch_size is not None and actions.shape[0] != batch_size:
        raise ValueError(f"response holds {actions.shape[0]} action chunks for a batch of {batch_size}")
    for key in ("domain_id", "raw_action_dim"):
        expected = None if parameters is None else parameters.get(key)
        for report in reports:
            if expected is not None and report.get(key) is not None and int(report[key]) != int(expected):
                raise ValueError(f"server answered with {key}={report[key]}, the request asked for {expected}")
    return actions
