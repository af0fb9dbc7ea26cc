"""The frozen half of the policy: canvases, prompt ids, VAE latents and action targets of a batch.

Everything here goes through the diffusers pipeline's own helpers (``_prepare_action_video_conditioning``,
``_encode_video``, ``_remove_action_video_padding_from_latent``, ``tokenize_prompt``), so training sees
what the served model sees. The whole micro-batch is prepared and VAE-encoded together (the pipeline
helpers take a ``[B, T, 3, H, W]`` tensor as well as one clip of PIL images; the two give identical
pixels, checked by the tests), in chunks of ``vae_batch_size`` clips.

The caption follows ``PolicyConfig.caption_style``: ``diffusers`` lets ``tokenize_prompt`` build it
from the task (``action_mode="policy"``), exactly as served; ``cosmos_framework`` builds NVIDIA's
training caption per sample (:mod:`~rlinf_cosmos3.models.cosmos3.captions`: one ``" | "``
paraphrase, the chunk's ``idle_frames``) and tokenizes that text verbatim with the same chat template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlinf_cosmos3.data.latent_cache import LATENT_KEY, LATENT_VALID_KEY
from rlinf_cosmos3.models.cosmos3.captions import (
    cosmos_framework_eval_caption,
    cosmos_framework_training_caption,
    eval_request_text,
    paraphrases,
)
from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig
from rlinf_cosmos3.models.cosmos3.keyed_noise import NoiseKeys
from rlinf_cosmos3.models.cosmos3.observation import compose_observation

CANVAS_KEY = "canvas"
"""Batch key of already composed canvases (uint8 ``[B, T, 3, H, W]``, :class:`~rlinf_cosmos3.models.cosmos3.
canvas_samples.CanvasSamples`): the batch carries them instead of the two camera views."""
IDLE_FRAMES_KEY = "idle_frames"
_PARAPHRASE_SALT = 0x5EED_CA97
"""Mixed into a sample generator's seed for its paraphrase draw, which so never consumes that generator."""


@dataclass
class EncodedSample:
    """One sample after the frozen parts (tokenizer, VAE): everything the loss needs."""

    input_ids: list[int]
    uncond_input_ids: list[int]
    x0_vision: torch.Tensor
    """Clean latents ``[1, C, T_latent, h, w]`` float32 (padding latents removed as the pipeline does)."""
    vision_frame_valid: torch.Tensor
    """``[T_latent]`` bool: False for latent frames made only of padding frames."""
    x0_action: torch.Tensor
    """Normalised actions ``[horizon, action_dim]`` float32, zero beyond ``raw_action_dim``."""
    action_valid: torch.Tensor
    """``[horizon]`` bool: False where the chunk ran past the episode end."""


def prepare_actions(
    actions: torch.Tensor, action_is_pad: torch.Tensor | None, action_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[H, raw]`` normalised actions -> (``[H, action_dim]`` zero-padded channels, ``[H]`` valid): one
    chunk of :func:`prepare_action_batch`."""
    x0, valid = prepare_action_batch(actions.unsqueeze(0), None if action_is_pad is None else action_is_pad.unsqueeze(0),
                                     action_dim)
    return x0[0], valid[0]


def prepare_action_batch(
    actions: torch.Tensor, action_is_pad: torch.Tensor | None, action_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, H, raw]`` normalised actions -> (``[B, H, action_dim]`` zero-padded channels, ``[B, H]`` valid).

    Padded steps (past the episode end) take the last real action before them - what the
    LeRobot reader already returns - so whatever they held cannot reach the model: they enter
    the sequence as noisy tokens that every other token attends to, and their loss is masked.
    The whole batch at once, on the actions' device: a handful of operations, not a few per sample.
    """
    batch, horizon, raw = actions.shape
    if raw > action_dim:
        raise ValueError(f"{raw} action channels exceed the model's action_dim {action_dim}")
    if action_is_pad is None:
        valid = torch.ones(batch, horizon, dtype=torch.bool, device=actions.device)
    else:
        valid = ~action_is_pad.bool().to(actions.device)
    if not bool(valid[:, 0].all()):
        raise ValueError("the first action of a chunk is padding; the sample has no real action")
    steps = torch.arange(horizon, device=actions.device).expand(batch, horizon)
    latest = torch.where(valid, steps, 0).cummax(dim=1).values  # per step: the latest real step so far
    real = actions.to(torch.float32).gather(1, latest.unsqueeze(-1).expand(batch, horizon, raw))
    x0 = torch.zeros(batch, horizon, action_dim, dtype=torch.float32, device=actions.device)
    x0[..., :raw] = real
    return x0, valid


def latent_frame_valid(frame_is_pad: torch.Tensor, temporal_factor: int) -> torch.Tensor:
    """Latent frame k covers pixel frames ``4k-3 .. 4k`` (frame 0 alone): valid if any is real."""
    real = ~frame_is_pad.bool()
    groups = [real[:1]] + [real[1 + k : 1 + k + temporal_factor] for k in range(0, len(real) - 1, temporal_factor)]
    return torch.stack([g.any() for g in groups])


class PolicyProcessor:
    """Turns a data batch into :class:`EncodedSample` s with the pipeline's frozen pieces."""

    def __init__(self, pipeline: Any, cfg: PolicyConfig, raw_action_dim: int) -> None:
        self.pipeline = pipeline
        self.cfg = cfg
        self.raw_action_dim = raw_action_dim
        self._prompt_ids: dict[str, tuple[list[int], list[int]]] = {}
        self._caption_ids: dict[str, tuple[list[int], list[int]]] = {}

    @property
    def device(self) -> torch.device:
        return next(self.pipeline.vae.parameters()).device

    # ------------------------------------------------------------------------------- prompts

    def prompt_ids(self, prompt: str) -> tuple[list[int], list[int]]:
        """(conditional, unconditional) token ids of the policy caption, tokenized once per prompt."""
        if prompt not in self._prompt_ids:
            cfg = self.cfg
            ids, uncond = self.pipeline.tokenize_prompt(
                prompt,
                None,
                num_frames=cfg.num_frames,
                height=cfg.canvas_height,
                width=cfg.canvas_width,
                fps=cfg.fps,
                use_system_prompt=False,
                action_mode="policy",
                action_view_point=cfg.view_point,
            )
            if len(self._prompt_ids) >= 4096:  # a handful of LIBERO tasks; bound it anyway
                self._prompt_ids.clear()
            self._prompt_ids[prompt] = (list(ids), list(uncond))
        return self._prompt_ids[prompt]

    def caption_ids(self, caption: str) -> tuple[list[int], list[int]]:
        """(conditional, unconditional) token ids of a ready caption: the chat template, no templates added."""
        if caption not in self._caption_ids:
            cfg = self.cfg
            ids, uncond = self.pipeline.tokenize_prompt(
                caption, None, num_frames=cfg.num_frames, height=cfg.canvas_height, width=cfg.canvas_width,
                fps=cfg.fps, use_system_prompt=False, add_resolution_template=False, add_duration_template=False,
            )
            if len(self._caption_ids) >= 4096:  # tasks x paraphrases x 17 idle counts; bound it anyway
                self._caption_ids.clear()
            self._caption_ids[caption] = (list(ids), list(uncond))
        return self._caption_ids[caption]

    def eval_prompt_ids(self, task: str) -> list[int]:
        """Token ids of the caption the eval prompts ``task`` with, in the configured style, as the embedded
        backend's pipeline tokenizes it (:func:`~rlinf_cosmos3.models.cosmos3.inference.predict_actions` on the
        adapter's request text): ``diffusers`` builds the policy caption from the task, ``cosmos_framework`` is
        NVIDIA's eval caption, verbatim. Conditional ids only: the eval samples with guidance 1.0. An in-process
        sampler (RL rollouts) prompts with these, so it acts on what the evaluated policy reads."""
        cfg = self.cfg
        text = eval_request_text(cfg.caption_style, task.strip())
        if cfg.caption_style == "diffusers":
            return self.prompt_ids(text)[0]
        caption = cosmos_framework_eval_caption(text, action_horizon=cfg.action_horizon, num_frames=cfg.num_frames,
                                                fps=cfg.fps, height=cfg.canvas_height, width=cfg.canvas_width)
        return self.caption_ids(caption)[0]

    def training_caption(self, task: str, idle_frames: int, generator: torch.Generator | int | None = None,
                         position: int = 0) -> str:
        """NVIDIA's training caption of one sample (``cosmos_framework`` style).

        A task with ``" | "`` paraphrases trains on one of them, drawn uniformly (as NVIDIA's
        ``random.choice``) from a generator seeded by ``generator``'s seed (or ``generator`` itself, an
        int seed) and ``position`` (the sample's place in the batch, when one generator serves the whole
        batch), so the draw is reproducible per (run seed, step, sample) and never shifts the noise draws.
        """
        cfg = self.cfg
        parts = paraphrases(task)
        if len(parts) == 1:
            choice = parts[0]
        else:
            if isinstance(generator, int):
                base = generator
            else:
                base = generator.initial_seed() if generator is not None else int(torch.randint(1 << 62, (1,)))
            seed = base ^ _PARAPHRASE_SALT
            draw = torch.Generator().manual_seed((seed + position) % (1 << 63))
            choice = parts[int(torch.randint(len(parts), (1,), generator=draw))]
        return cosmos_framework_training_caption(
            choice, idle_frames=idle_frames, action_horizon=cfg.action_horizon, num_frames=cfg.num_frames,
            fps=cfg.fps, height=cfg.canvas_height, width=cfg.canvas_width)

    def sample_ids(self, batch: Mapping[str, Any], i: int, generator: torch.Generator | int | None = None,
                   position: int = 0) -> tuple[list[int], list[int]]:
        """Token ids of sample ``i``'s caption in the configured style (see :meth:`training_caption`)."""
        prompt = batch["prompt"][i]
        if self.cfg.caption_style == "diffusers":
            return self.prompt_ids(prompt)
        if IDLE_FRAMES_KEY not in batch:
            raise ValueError(
                "caption_style 'cosmos_framework' needs the batch's 'idle_frames' (the LIBERO reader adds it; "
                "a latent cache built before it was recorded has none: rebuild it in a new directory)")
        caption = self.training_caption(prompt, int(batch[IDLE_FRAMES_KEY][i]), generator, position)
        return self.caption_ids(caption)

    # ------------------------------------------------------------------------------- pixels

    @torch.no_grad()
    def encode_canvases(self, canvases: torch.Tensor, num_frames: int | None = None) -> torch.Tensor:
        """uint8 ``[B, T, 3, H, W]`` canvases -> clean latents ``[B, C, T_latent, h, w]`` (the VAE's dtype).

        The clip is the first ``num_frames`` (default: the policy's) frames, the last one held where there are
        fewer, as the pipeline holds a policy condition's image. ``num_frames=1`` encodes the first frame alone:
        the Wan VAE encodes a clip's frame 0 in a chunk of its own, so its latent is the same."""
        cfg, pipe = self.cfg, self.pipeline
        num_frames = cfg.num_frames if num_frames is None else int(num_frames)
        latents = []
        for start in range(0, canvases.shape[0], cfg.vae_batch_size):
            chunk = canvases[start : start + cfg.vae_batch_size].to(self.device)
            video, image_size, height, width = pipe._prepare_action_video_conditioning(
                chunk.to(torch.float32) / 255.0, cfg.objective.resolution_tier, num_frames,
                device=self.device, dtype=torch.float32,
            )
            if (height, width) != (cfg.canvas_height, cfg.canvas_width):
                raise ValueError(
                    f"resolution_tier {cfg.objective.resolution_tier} bins the canvas to {height}x{width}, "
                    f"not {cfg.canvas_height}x{cfg.canvas_width}"
                )
            x0 = pipe._encode_video(video).contiguous()
            latents.append(pipe._remove_action_video_padding_from_latent(x0, image_size))
        return torch.cat(latents)

    @torch.no_grad()
    def encode_pixels(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """A pixel batch's clean latents (``[B, C, T_latent, h, w]``, the VAE's dtype) and latent-frame
        validity (``[B, T_latent]`` bool, from ``frame_is_pad``): what a latent cache stores."""
        latents = self.encode_canvases(self.canvases(batch))
        frame_is_pad = batch.get("frame_is_pad")
        pad = (frame_is_pad.cpu() if frame_is_pad is not None
               else torch.zeros(latents.shape[0], self.cfg.num_frames, dtype=torch.bool))
        temporal = self.pipeline.vae_scale_factor_temporal
        return latents, torch.stack([latent_frame_valid(p, temporal) for p in pad])

    def canvases(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The batch's ``[main | wrist]`` canvases, uint8 ``[B, T, 3, H, W]`` (composed by the loader's
        workers when the batch has them, else here)."""
        cfg = self.cfg
        if CANVAS_KEY in batch:
            canvases = batch[CANVAS_KEY]
            if canvases.ndim != 5 or tuple(canvases.shape[2:]) != (3, cfg.canvas_height, cfg.canvas_width):
                raise ValueError(f"batch canvases {tuple(canvases.shape)} != [B, T, 3, {cfg.canvas_height}, "
                                 f"{cfg.canvas_width}] (composed for another canvas?)")
            return canvases
        return compose_observation(batch[cfg.main_image_key], batch[cfg.wrist_image_key],
                                   height=cfg.canvas_height, width=cfg.canvas_width)

    # ------------------------------------------------------------------------------- batch

    @torch.no_grad()
    def encode_batch(
        self,
        batch: Mapping[str, Any],
        action_dim: int,
        generators: torch.Generator | Sequence[torch.Generator] | NoiseKeys | None = None,
    ) -> list[EncodedSample]:
        """Tokenize prompts, VAE-encode the 17-frame canvases (or take cached latents), prepare actions.

        ``generators`` (one per sample, one for all, or the batch's :class:`NoiseKeys`, whose per-sample
        generator seeds stand in) only seed the ``cosmos_framework`` style's paraphrase draws; they are not
        consumed.
        """
        cfg = self.cfg
        prompts = batch["prompt"]
        actions = batch["actions"]
        cached = LATENT_KEY in batch
        if cached:
            sizes = {"latents": batch[LATENT_KEY].shape[0]}
        else:
            if CANVAS_KEY in batch:
                views = {"canvases": batch[CANVAS_KEY]}
            else:
                views = {"main": batch[cfg.main_image_key], "wrist": batch[cfg.wrist_image_key]}
            sizes = {name: v.shape[0] for name, v in views.items()}
            frames = next(iter(views.values())).shape[1]
            if frames != cfg.num_frames:
                raise ValueError(f"batch has {frames} frames per sample, the policy needs {cfg.num_frames}")
        sizes.update({"action chunks": actions.shape[0], "prompts": len(prompts)})
        if len(set(sizes.values())) != 1:
            raise ValueError("batch sizes differ: " + ", ".join(f"{v} {k}" for k, v in sizes.items()))
        if tuple(actions.shape[1:]) != (cfg.action_horizon, self.raw_action_dim):
            raise ValueError(
                f"actions {tuple(actions.shape)} != [B, {cfg.action_horizon}, {self.raw_action_dim}]"
            )
        device = self.device
        if cached:  # from the loader's pinned memory on a GPU: the copies need not wait
            x0 = batch[LATENT_KEY].to(device=device, non_blocking=True).to(torch.float32)
            frame_valid = batch[LATENT_VALID_KEY].to(device=device, dtype=torch.bool, non_blocking=True)
        else:
            x0, frame_valid = self.encode_pixels(batch)
            x0, frame_valid = x0.float(), frame_valid.to(device)
        if not cfg.objective.mask_padded_frames:
            frame_valid = torch.ones_like(frame_valid)
        # The batch's actions are prepared where the reader left them (the CPU) and moved once, without waiting
        # for the device (a pageable source is staged by the copy call itself).
        x0_actions, actions_valid = prepare_action_batch(actions, batch.get("action_is_pad"), action_dim)
        x0_actions = x0_actions.to(device, non_blocking=True)
        actions_valid = actions_valid.to(device, non_blocking=True)
        # Per-sample generators (seeded by dataset index) need no position: the draw stays rank-split invariant.
        if isinstance(generators, NoiseKeys):
            per_sample: Sequence[Any] | None = (generators.sample_seeds() if cfg.caption_style != "diffusers"
                                                else [None] * len(prompts))
        else:
            per_sample = None if not isinstance(generators, Sequence) else generators
        encoded = []
        # Each sample's views, made by one operation per tensor (not four per sample).
        views = zip(x0.split(1), frame_valid.unbind(0), x0_actions.unbind(0), actions_valid.unbind(0), strict=True)
        for i, (x0_i, frame_valid_i, x0_action_i, action_valid_i) in enumerate(views):
            generator = generators if per_sample is None else per_sample[i]
            ids, uncond_ids = self.sample_ids(batch, i, generator, i if per_sample is None else 0)
            encoded.append(EncodedSample(
                input_ids=ids,
                uncond_input_ids=uncond_ids,
                x0_vision=x0_i,
                vision_frame_valid=frame_valid_i,
                x0_action=x0_action_i,
                action_valid=action_valid_i,
            ))
        return encoded
