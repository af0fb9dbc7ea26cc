"""The embedded backend: diffusers' ``Cosmos3OmniPipeline`` inside Ray actors, no server process.

Useful where SGLang is not available or to cross-check it. Each :class:`EmbeddedPolicyWorker`
rank loads the pipeline on its device (bf16; fp32 on request — both measured to work on CPU with
the tiny model) and serves the same payload dict the SGLang backend posts, so both see the same
composed canvas, prompt, steps, fps, seed and guidance (1.0). Like SGLang's action endpoint it
uses no system prompt (``use_system_prompt=False``). The pipeline takes one observation per call,
so a batched payload is served image by image, observation ``i`` with its own generator seeded
``seed + i`` (:func:`observation_seed`): two observations of one request never share their noise,
the same request gives the same actions, and observation ``i`` gets what a one-observation request
with seed ``seed + i`` gets. The outputs are the same normalised ``[B, 16, 10]`` chunks the adapter
de-normalises.
The numbers differ from SGLang's for the same seed (different noise draws and sampler code).

Two things only this backend reproduces exactly (:class:`~rlinf_cosmos3.models.cosmos3.captioned_pipeline.
CaptionedCosmos3Pipeline`): the ``cosmos_framework`` caption style's eval caption, ``"idle_frame"``
field included (SGLang's request has no such field), and the request's ``flow_shift``, set on the
scheduler (SGLang takes it from the request too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlinf_cosmos3.cluster import Worker
from rlinf_cosmos3.config.rollout import EmbeddedConfig, RolloutModelConfig
from rlinf_cosmos3.workers.rollout.backend import RolloutBackend
from rlinf_cosmos3.workers.rollout.protocol import payload_images, payload_prompts

if TYPE_CHECKING:
    from rlinf_cosmos3.cluster import Cluster, WorkerGroup

logger = logging.getLogger(__name__)


def observation_seed(seed: int, index: int) -> int:
    """Generator seed of observation ``index`` of a request with ``seed`` (index 0 keeps the request's)."""
    return seed + index


class EmbeddedPolicyWorker(Worker):
    """One rank: the diffusers pipeline on this rank's device."""

    def __init__(self, model_path: str, precision: str = "bf16", caption_style: str = "diffusers") -> None:
        import torch

        from rlinf_cosmos3.models.cosmos3.captioned_pipeline import CaptionedCosmos3Pipeline
        from rlinf_cosmos3.models.cosmos3.captions import check_style

        check_style(caption_style)
        self.caption_style = caption_style
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.pipe = CaptionedCosmos3Pipeline.from_pretrained(model_path, enable_safety_checker=False, dtype=dtype)
        self.pipe.to(self.device)
        self.pipe.set_progress_bar_config(disable=True)
        self.logger.info("Cosmos3 pipeline loaded from %s on %s (%s)", model_path, self.device, precision)

    def generate(self, payload: Mapping[str, Any]) -> np.ndarray:
        """One payload -> normalised ``[B, horizon, raw_action_dim]`` float32, image by image."""
        from rlinf_cosmos3.models.cosmos3.inference import predict_actions

        params = payload["parameters"]
        if params.get("action_mode", "policy") != "policy":
            raise ValueError(f"the embedded backend serves policy requests only, got {params['action_mode']!r}")
        images, prompts = payload_images(payload), payload_prompts(payload)
        if len(prompts) != len(images):
            raise ValueError(f"{len(prompts)} prompts for {len(images)} images")
        canvas = (int(params["height"]), int(params["width"]))
        if tuple(images.shape[1:3]) != canvas:
            raise ValueError(f"images are {images.shape[1]}x{images.shape[2]}, the request's canvas is "
                             f"{canvas[0]}x{canvas[1]}: compose them first (the SGLang path would crop)")
        chunks = []
        for index, (image, prompt) in enumerate(zip(images, prompts, strict=True)):
            actions = predict_actions(
                self.pipe, image, prompt, seed=observation_seed(int(params["seed"]), index),
                domain_name=params["domain_name"], action_horizon=int(params["action_horizon"]),
                view_point=params["action_view_point"], num_frames=int(params["num_frames"]), fps=float(params["fps"]),
                num_inference_steps=int(params["num_inference_steps"]), guidance_scale=float(params["guidance_scale"]),
                caption_style=self.caption_style, flow_shift=params.get("flow_shift"))
            chunks.append(actions.float().cpu().numpy())
        return np.stack(chunks).astype(np.float32)


class EmbeddedPolicyBackend(RolloutBackend):
    """A WorkerGroup of :class:`EmbeddedPolicyWorker`; payloads go to the least-loaded rank."""

    def __init__(self, model_cfg: RolloutModelConfig, cfg: EmbeddedConfig, *, cluster: Cluster) -> None:
        self.model_cfg = model_cfg
        self.cfg = cfg.validate()
        self.cluster = cluster
        self._group: WorkerGroup | None = None
        self._inflight: list[int] = []
        self._cond: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def max_batch_size(self) -> int:
        return self.cfg.batching_max_size

    def start(self) -> None:
        from rlinf_cosmos3.cluster import WorkerGroup

        if self._group is not None:
            raise RuntimeError("EmbeddedPolicyBackend is already started")
        self._group = WorkerGroup(
            EmbeddedPolicyWorker, self.cluster, self.cfg.num_workers,
            args=(str(self.model_cfg.model_path), self.model_cfg.precision, self.model_cfg.caption_style),
            gpus_per_rank=self.cfg.gpus_per_worker, cpus_per_rank=self.cfg.cpus_per_worker,
            name="EmbeddedPolicyGroup", init_distributed=False,
        )
        self._inflight = [0] * self.cfg.num_workers

    def close(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.shutdown()

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._cond is None or self._loop is not loop:
            self._cond, self._loop = asyncio.Condition(), loop
            self._inflight = [0] * self.cfg.num_workers
        return self._cond

    async def _generate_one(self, payload: Mapping[str, Any]) -> np.ndarray:
        if self._group is None:
            raise RuntimeError("EmbeddedPolicyBackend is not started")
        batch = len(payload_images(payload))
        if batch > self.max_batch_size:
            raise ValueError(f"a request of {batch} images exceeds batching_max_size={self.max_batch_size}")
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: min(self._inflight) < self.cfg.max_inflight_per_worker)
            rank = int(np.argmin(self._inflight))
            self._inflight[rank] += 1
        try:
            return await self._group.actors[rank].generate.remote(payload)
        finally:
            async with cond:
                self._inflight[rank] -= 1
                cond.notify_all()

    async def generate(self, payloads: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        return list(await asyncio.gather(*(self._generate_one(p) for p in payloads)))
