"""Cosmos3Policy: the flow-matching SFT objective of the Cosmos3 policy task on diffusers' own pieces.

The model sees at training exactly what it sees when served: the sequence is built with the
diffusers ``Cosmos3OmniPipeline`` helpers (``tokenize_prompt(..., action_mode="policy")``,
``_prepare_action_video_conditioning``, ``_encode_video``, ``_prepare_text_segment``,
``_prepare_vision_segment``, ``_prepare_action_segment``), with the serving path's settings
(SGLang: no system prompt, guidance 1.0 so no unconditional pass). ``tests/test_policy_parity.py``
checks this against what the pipeline passes to the transformer.

Objective (cosmos-framework ``omni_mot_model.py`` ``training_step``/``_add_noise_to_input``/
``_compute_losses`` and ``algorithm/loss/flow_matching.py``; choices of ours in
``docs/sft_objective.md``): per sample one sigma, shared by vision and actions
(``independent_action_schedule=False``); the clean first latent frame is the condition, the later
latent frames and the 16 action tokens are noised, ``x_t = sigma * eps + (1 - sigma) * x0``; the
transformer gets timestep ``1000 * sigma`` and predicts the velocity ``eps - x0``; the loss is
``loss_scale * (vision_mse + action_loss_weight * action_mse)``.

The transformer takes one packed sequence per call (its causal text prefix ``und_len`` and the
generation tokens attending to all of it have no per-sample mask), so samples are encoded and run
one at a time and the losses averaged; per-sample work is also identical whatever the batch split,
which keeps data-parallel training bit-equal to one process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import Cosmos3OmniPipeline
from PIL import Image
from torch import nn

from rlinf_cosmos3.models.cosmos3 import loading
from rlinf_cosmos3.models.cosmos3.action_condition import policy_condition
from rlinf_cosmos3.models.cosmos3.domains import ACTION_HORIZON, LIBERO_DOMAIN_NAME, get_action_domain
from rlinf_cosmos3.models.cosmos3.observation import (
    CANVAS_HEIGHT,
    CANVAS_WIDTH,
    VIEW_POINT,
    compose_observation,
)
from rlinf_cosmos3.models.cosmos3.parallelize import precision_dtype

logger = logging.getLogger(__name__)

NUM_TRAIN_TIMESTEPS = 1000
"""Timestep = sigma x 1000 (``omni_mot_model.py`` L1808; the transformer's ``timestep_scale`` 0.001
undoes it; the pipeline's UniPC flow timesteps are ``1000 sigma`` too)."""

SHIFT_BY_TIER = {"256": 3.0, "480": 5.0, "720": 10.0}
"""``nano_model_config.py`` L93 ``rectified_flow_training_config.shift``, looked up per sample by the
canvas tier (``utils/generator/image_resize.py`` ``get_vision_data_resolution``)."""

WAVER_MODE_S = 1.29  # rectified_flow.py TrainTimeSampler._WAVER_MODE_S
SIGMA_DISTRIBUTIONS = ("waver", "logitnormal", "uniform")


def canvas_tier(height: int, width: int) -> str:
    """cosmos-framework's resolution tier of a canvas (``get_vision_data_resolution``, min side)."""
    side = min(height, width)
    for tier, limit in (("256", 256), ("480", 640), ("720", 960)):
        if side <= limit:
            return tier
    raise ValueError(f"no training shift for a {height}x{width} canvas")


def sample_sigma(distribution: str, shift: float, generator: torch.Generator | None) -> torch.Tensor:
    """One training sigma in [0, 1] (float32, 0-d, on the generator's device), as
    ``TrainTimeSampler.__call__`` draws it: ``rectified_flow.py`` L49-58 (the draw) and L88-90 (the
    shift ``s t / (1 + (s - 1) t)``).
    """
    device = _generator_device(generator)
    if distribution == "waver":
        u = torch.rand((1,), dtype=torch.float32, generator=generator, device=device)
        t = 1.0 - u - WAVER_MODE_S * (torch.cos(torch.pi / 2.0 * u) ** 2 - 1 + u)
    elif distribution == "logitnormal":
        t = torch.sigmoid(torch.randn((1,), generator=generator, device=device))
    elif distribution == "uniform":
        t = torch.rand((1,), generator=generator, device=device)
    else:
        raise ValueError(f"unknown sigma distribution {distribution!r}; choose one of {SIGMA_DISTRIBUTIONS}")
    shift_t = torch.tensor([shift], dtype=torch.float32, device=device)
    return (shift_t * t / (1 + (shift_t - 1) * t))[0]


def _generator_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


@dataclass(frozen=True)
class PolicyConfig:
    """What the policy is (must match serving) and how it is trained (NVIDIA's LIBERO recipe)."""

    domain_name: str = LIBERO_DOMAIN_NAME
    action_horizon: int = ACTION_HORIZON
    fps: float = 20.0
    canvas_height: int = CANVAS_HEIGHT
    canvas_width: int = CANVAS_WIDTH
    resolution_tier: int = 256
    """diffusers ``CosmosActionCondition.resolution_tier``; must bin to the canvas size."""
    view_point: str = VIEW_POINT
    main_image_key: str = "image"
    wrist_image_key: str = "wrist_image"
    sigma_distribution: str = "waver"
    """``nano_model_config.py`` L97 ``train_time_video_distribution``; actions share the vision sigma."""
    shift: float | None = None
    """None: by canvas tier (3.0 for the 192x320 canvas)."""
    loss_scale: float = 10.0
    """``action_policy_libero_all_nano.py`` L38 (vision); actions get ``loss_scale * action_loss_weight``."""
    action_loss_weight: float = 1.0
    """Relative to vision: 10 x 1.0 = NVIDIA's absolute ``action_loss_weight`` 10 (``nano_model_config.py`` L88)."""
    caption_dropout: float = 0.0
    """Chance to train on the unconditional prompt (NVIDIA: 0.1, for CFG; serving uses no CFG)."""
    mask_padded_frames: bool = True
    """Leave out of the vision loss the latent frames made only of padding frames."""
    precision: str | None = None
    """Dtype the noisy tokens enter the transformer in (``bf16`` under FSDP2 bf16 mixed precision);
    None: the transformer's parameter dtype."""

    def __post_init__(self) -> None:
        if self.sigma_distribution not in SIGMA_DISTRIBUTIONS:
            raise ValueError(f"sigma_distribution {self.sigma_distribution!r} not in {SIGMA_DISTRIBUTIONS}")
        if not 0.0 <= self.caption_dropout < 1.0:
            raise ValueError(f"caption_dropout must be in [0, 1), got {self.caption_dropout}")
        if self.precision is not None:
            precision_dtype(self.precision)
        get_action_domain(self.domain_name)

    @property
    def num_frames(self) -> int:
        return self.action_horizon + 1

    @property
    def training_shift(self) -> float:
        return self.shift if self.shift is not None else SHIFT_BY_TIER[canvas_tier(self.canvas_height, self.canvas_width)]


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
    """``[H, raw]`` normalised actions -> (``[H, action_dim]`` zero-padded channels, ``[H]`` valid).

    Padded steps (past the episode end) take the last real action before them - what the
    LeRobot reader already returns - so whatever they held cannot reach the model: they enter
    the sequence as noisy tokens that every other token attends to, and their loss is masked.
    """
    horizon, raw = actions.shape
    if raw > action_dim:
        raise ValueError(f"{raw} action channels exceed the model's action_dim {action_dim}")
    pad = action_is_pad.bool().to(actions.device) if action_is_pad is not None else None
    valid = ~pad if pad is not None else torch.ones(horizon, dtype=torch.bool, device=actions.device)
    if not bool(valid[0]):
        raise ValueError("the first action of a chunk is padding; the sample has no real action")
    real = actions.to(torch.float32)
    if pad is not None and bool(pad.any()):
        last = torch.cumsum(valid.long(), 0) - 1  # per step: index of the latest real step so far
        real = real[valid][last]
    x0 = torch.zeros(horizon, action_dim, dtype=torch.float32, device=actions.device)
    x0[:, :raw] = real
    return x0, valid


def latent_frame_valid(frame_is_pad: torch.Tensor, temporal_factor: int) -> torch.Tensor:
    """Latent frame k covers pixel frames ``4k-3 .. 4k`` (frame 0 alone): valid if any is real."""
    real = ~frame_is_pad.bool()
    groups = [real[:1]] + [real[1 + k : 1 + k + temporal_factor] for k in range(0, len(real) - 1, temporal_factor)]
    return torch.stack([g.any() for g in groups])


class Cosmos3Policy(nn.Module):
    """Trainable Cosmos3 transformer + frozen VAE/tokenizer, with the policy SFT loss.

    ``transformer`` is what trains and what checkpoints save; the VAE is frozen (no grads, eval,
    never sharded). ``pipeline`` is diffusers' pipeline over the same modules, used for its
    sequence helpers and for :meth:`predict`.
    """

    def __init__(
        self,
        transformer: nn.Module,
        vae: nn.Module,
        tokenizer: Any,
        scheduler: Any,
        cfg: PolicyConfig | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg or PolicyConfig()
        self.transformer = transformer
        self.vae = vae.eval().requires_grad_(False)
        self.domain = get_action_domain(self.cfg.domain_name)
        self.pipeline = Cosmos3OmniPipeline(
            transformer=transformer,
            text_tokenizer=tokenizer,
            vae=vae,
            scheduler=scheduler,
            enable_safety_checker=False,
            default_use_system_prompt=False,  # SGLang's action mode sends no system prompt
        )
        self.pipeline.set_progress_bar_config(disable=True)

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        cfg: PolicyConfig | None = None,
        *,
        device: torch.device | str = "cpu",
        transformer_dtype: torch.dtype = torch.float32,
        vae_dtype: torch.dtype = torch.float32,
        transformer_on_meta: bool = False,
    ) -> Cosmos3Policy:
        """Load a diffusers Cosmos3 directory; ``transformer_on_meta`` for shard-then-load (fp32 master)."""
        transformer = (
            loading.build_transformer_on_meta(model_dir)
            if transformer_on_meta
            else loading.load_transformer(model_dir, dtype=transformer_dtype, device=device)
        )
        vae = loading.load_vae(model_dir, dtype=vae_dtype, device=device)
        return cls(transformer, vae, loading.load_tokenizer(model_dir), loading.load_scheduler(model_dir), cfg)

    def train(self, mode: bool = True) -> Cosmos3Policy:
        """Train mode for the transformer only: the frozen VAE stays in eval mode."""
        super().train(mode)
        self.vae.eval()
        return self

    # ------------------------------------------------------------------ properties

    @property
    def device(self) -> torch.device:
        """Where inputs go: the VAE's device (the transformer may be sharded or still on meta)."""
        return next(self.vae.parameters()).device

    @property
    def compute_dtype(self) -> torch.dtype:
        if self.cfg.precision is not None:
            return precision_dtype(self.cfg.precision)
        return self.transformer.dtype

    # ------------------------------------------------------------------ frozen part

    @torch.no_grad()
    def encode_batch(self, batch: Mapping[str, Any]) -> list[EncodedSample]:
        """Tokenize prompts and VAE-encode the 17-frame canvases, one sample at a time like the pipeline."""
        cfg, pipe = self.cfg, self.pipeline
        prompts = batch["prompt"]
        main, wrist = batch[cfg.main_image_key], batch[cfg.wrist_image_key]
        actions = batch["actions"]
        if not main.shape[0] == wrist.shape[0] == actions.shape[0] == len(prompts):
            raise ValueError(
                f"batch sizes differ: {main.shape[0]} main, {wrist.shape[0]} wrist, "
                f"{actions.shape[0]} action chunks, {len(prompts)} prompts"
            )
        if main.shape[1] != cfg.num_frames:
            raise ValueError(f"batch has {main.shape[1]} frames per sample, the policy needs {cfg.num_frames}")
        if tuple(actions.shape[1:]) != (cfg.action_horizon, self.domain.raw_action_dim):
            raise ValueError(
                f"actions {tuple(actions.shape)} != [B, {cfg.action_horizon}, {self.domain.raw_action_dim}]"
            )
        action_is_pad = batch.get("action_is_pad")
        frame_is_pad = batch.get("frame_is_pad")
        action_dim = self.transformer.config.action_dim
        temporal = pipe.vae_scale_factor_temporal
        encoded = []
        for i, prompt in enumerate(prompts):
            canvas = compose_observation(main[i], wrist[i], height=cfg.canvas_height, width=cfg.canvas_width)
            clip = [Image.fromarray(frame.permute(1, 2, 0).numpy()) for frame in canvas.cpu()]
            video, image_size, height, width = pipe._prepare_action_video_conditioning(
                clip, cfg.resolution_tier, cfg.num_frames, device=self.device, dtype=torch.float32
            )
            if (height, width) != (cfg.canvas_height, cfg.canvas_width):
                raise ValueError(
                    f"resolution_tier {cfg.resolution_tier} bins the canvas to {height}x{width}, "
                    f"not {cfg.canvas_height}x{cfg.canvas_width}"
                )
            x0 = pipe._encode_video(video).contiguous().float()
            x0 = pipe._remove_action_video_padding_from_latent(x0, image_size)
            ids, uncond_ids = pipe.tokenize_prompt(
                prompt,
                None,
                num_frames=cfg.num_frames,
                height=height,
                width=width,
                fps=cfg.fps,
                use_system_prompt=False,
                action_mode="policy",
                action_view_point=cfg.view_point,
            )
            x0_action, action_valid = prepare_actions(
                actions[i].to(self.device), action_is_pad[i] if action_is_pad is not None else None, action_dim
            )
            pad = frame_is_pad[i].cpu() if frame_is_pad is not None else torch.zeros(cfg.num_frames, dtype=torch.bool)
            frame_valid = latent_frame_valid(pad, temporal)
            if not cfg.mask_padded_frames:
                frame_valid = torch.ones_like(frame_valid)
            encoded.append(
                EncodedSample(
                    input_ids=list(ids),
                    uncond_input_ids=list(uncond_ids),
                    x0_vision=x0,
                    vision_frame_valid=frame_valid.to(self.device),
                    x0_action=x0_action,
                    action_valid=action_valid,
                )
            )
        return encoded

    # ------------------------------------------------------------------ sequence

    def transformer_inputs(
        self,
        input_ids: Sequence[int],
        noisy_vision: torch.Tensor,
        noisy_action: torch.Tensor,
        timestep: float,
    ) -> dict[str, Any]:
        """The transformer's keyword arguments for one sample, assembled as ``Cosmos3OmniPipeline.__call__``
        does (steps 3 and 5 of its conditional pass), with the clean first latent frame as condition."""
        pipe, device, fps = self.pipeline, self.device, self.cfg.fps
        text = pipe._prepare_text_segment(list(input_ids), device=device)
        vision = pipe._prepare_vision_segment(
            input_vision_tokens=noisy_vision,
            has_image_condition=True,
            mrope_offset=text["vision_start_temporal_offset"],
            vision_fps=fps,
            curr=text["und_len"],
            device=device,
            condition_frame_indexes=[0],
        )
        action = pipe._prepare_action_segment(
            input_action_tokens=noisy_action,
            condition_frame_indexes=[],  # policy: every action token is generated
            mrope_offset=text["vision_start_temporal_offset"],
            action_fps=fps,
            curr=text["und_len"] + vision["num_vision_tokens"],
            device=device,
        )
        dtype = self.compute_dtype
        return {
            "input_ids": text["input_ids"],
            "text_indexes": text["text_indexes"],
            "position_ids": torch.cat(
                [text["text_mrope_ids"], vision["vision_mrope_ids"], action["action_mrope_ids"]], dim=1
            ),
            "und_len": text["und_len"],
            "sequence_length": text["und_len"] + vision["num_vision_tokens"] + action["action_len"],
            "vision_tokens": [noisy_vision.to(device=device, dtype=dtype)],
            "vision_token_shapes": vision["vision_token_shapes"],
            "vision_sequence_indexes": vision["vision_sequence_indexes"],
            "vision_mse_loss_indexes": vision["vision_mse_loss_indexes"],
            "vision_timesteps": torch.full((vision["num_noisy_vision_tokens"],), timestep, device=device),
            "vision_noisy_frame_indexes": vision["vision_noisy_frame_indexes"],
            "action_tokens": [noisy_action.to(device=device, dtype=dtype)],
            "action_token_shapes": action["action_token_shapes"],
            "action_sequence_indexes": action["action_sequence_indexes"],
            "action_mse_loss_indexes": action["action_mse_loss_indexes"],
            "action_timesteps": torch.full((action["num_noisy_action_tokens"],), timestep, device=device),
            "action_noisy_frame_indexes": action["action_noisy_frame_indexes"],
            "action_domain_ids": [torch.tensor([self.domain.domain_id], dtype=torch.long, device=device)],
        }

    # ------------------------------------------------------------------ loss

    def sft_loss(
        self,
        batch: Mapping[str, Any],
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Flow-matching loss of a training batch (``rlinf_cosmos3.data`` layout) and its parts.

        ``generator`` draws sigma, noise and caption dropout: one generator for the whole batch
        (sample after sample), or one per sample - e.g. seeded from (seed, step, global sample
        index), which makes the draws independent of how the batch is split over ranks.
        """
        return self.loss_from_encoded(self.encode_batch(batch), generator)

    def loss_from_encoded(
        self,
        samples: Sequence[EncodedSample],
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of :meth:`sft_loss` on already encoded samples (frozen parts run once, e.g. cached)."""
        if not samples:
            raise ValueError("empty batch")
        if isinstance(generator, Sequence):
            if len(generator) != len(samples):
                raise ValueError(f"{len(generator)} generators for {len(samples)} samples")
            generators = list(generator)
        else:
            generators = [generator] * len(samples)
        parts = [self._sample_loss(sample, gen) for sample, gen in zip(samples, generators, strict=True)]
        vision = torch.stack([v for v, _ in parts]).mean()
        action = torch.stack([a for _, a in parts]).mean()
        loss = self.cfg.loss_scale * (vision + self.cfg.action_loss_weight * action)
        metrics = {"loss": loss.detach(), "vision_loss": vision.detach(), "action_loss": action.detach()}
        return loss, metrics

    def _sample_loss(
        self, sample: EncodedSample, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(vision MSE, action MSE) of one sample, unscaled; see docs/sft_objective.md."""
        cfg, device = self.cfg, self.device
        raw_dim = self.domain.raw_action_dim
        x0_v, x0_a = sample.x0_vision, sample.x0_action
        # Draw order (fixed, for reproducibility): sigma, vision noise, action noise, caption dropout.
        # Drawn on the generator's device (CPU by default) so the numbers do not depend on the GPU.
        sigma = sample_sigma(cfg.sigma_distribution, cfg.training_shift, generator)
        gen_device = _generator_device(generator)
        eps_v = torch.randn(x0_v.shape, generator=generator, device=gen_device).to(device)
        eps_a = torch.randn(x0_a.shape, generator=generator, device=gen_device).to(device)
        dropped = cfg.caption_dropout > 0 and float(torch.rand((), generator=generator, device=gen_device)) < cfg.caption_dropout

        # omni_mot_model.py L1968-1976: per-latent-frame sigma, zero on the clean condition frame;
        # rectified_flow.py L208-209: x_t = eps * sigma + x0 * (1 - sigma), target eps - x0.
        num_latent = x0_v.shape[2]
        noisy = torch.ones(num_latent, 1, 1, device=device)
        noisy[0] = 0.0
        sigma_v = sigma.to(device) * noisy
        xt_v = eps_v * sigma_v + x0_v * (1 - sigma_v)
        sigma_a = sigma.to(device)
        xt_a = eps_a * sigma_a + x0_a * (1 - sigma_a)
        xt_a[:, raw_dim:] = 0  # L2060: padded channels are zero, as the pipeline keeps them
        timestep = float(sigma) * NUM_TRAIN_TIMESTEPS

        ids = sample.uncond_input_ids if dropped else sample.input_ids
        preds_v, _, preds_a = self.transformer(
            **self.transformer_inputs(ids, xt_v, xt_a, timestep), return_dict=False
        )

        # flow_matching.py L66-93 (normalize_loss_by_active=False): mean over all elements with the
        # condition frame zeroed (it stays in the denominator); actions: first raw_action_dim channels.
        vision_mask = noisy * sample.vision_frame_valid.to(torch.float32).view(-1, 1, 1)
        sq_v = (preds_v[0].float() - (eps_v - x0_v)) ** 2
        vision_loss = (sq_v * vision_mask).mean()
        sq_a = (preds_a[0].float() - (eps_a - x0_a))[:, :raw_dim] ** 2
        action_mask = sample.action_valid.to(torch.float32).view(-1, 1)
        action_loss = (sq_a * action_mask).sum() / sq_a.numel()
        return vision_loss, action_loss

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def predict(
        self,
        main: np.ndarray,
        wrist: np.ndarray,
        prompt: str,
        *,
        seed: int,
        num_inference_steps: int = 10,
    ) -> torch.Tensor:
        """Normalised ``[horizon, raw_action_dim]`` actions for one observation (two ``[h, w, 3]``
        uint8 views) through the diffusers pipeline, set up as the SGLang server runs it.

        Needs a transformer the pipeline can call directly: unsharded, or sharded without mixed
        precision (the pipeline casts tokens to the parameters' dtype).
        """
        cfg = self.cfg
        canvas = compose_observation(
            np.asarray(main), np.asarray(wrist), height=cfg.canvas_height, width=cfg.canvas_width, channels_last=True
        )
        # PIL, as SGLang receives it: diffusers reads uint8 arrays as if they were in [0, 1].
        condition = policy_condition(
            Image.fromarray(canvas),
            domain_name=cfg.domain_name,
            chunk_size=cfg.action_horizon,
            resolution_tier=cfg.resolution_tier,
            view_point=cfg.view_point,
        )
        out = self.pipeline(
            prompt=prompt,
            action=condition,
            num_inference_steps=num_inference_steps,
            guidance_scale=1.0,
            fps=cfg.fps,
            generator=torch.Generator().manual_seed(seed),
            output_type="latent",
            use_system_prompt=False,
        )
        return out.action[0]

