"""What a Cosmos3 policy is (must match serving) and how it is trained (NVIDIA's LIBERO recipe).

Sources of the recipe values (cosmos-framework): ``nano_model_config.py`` (sigma distribution,
shift per canvas tier, action loss weight), ``action_policy_libero_all_nano.py`` (loss scale,
caption dropout), ``rectified_flow.py`` (``TrainTimeSampler``: how a training sigma is drawn).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import torch

from rlinf_cosmos3.config.model_settings import CAPTION_STYLES, RECIPE, ModelSettings, setting_values
from rlinf_cosmos3.config.sft import (
    ATTENTION_BACKENDS,
    DEFAULT_MAX_TOKENS_PER_PACK,
    SIGMA_DISTRIBUTIONS,
    SFTConfig,
    sft_model_settings,
)
from rlinf_cosmos3.models.cosmos3.captions import CONCAT_VIEW
from rlinf_cosmos3.models.cosmos3.domains import get_action_domain
from rlinf_cosmos3.models.cosmos3.parallelize import precision_dtype

NUM_TRAIN_TIMESTEPS = 1000
"""Timestep = sigma x 1000 (``omni_mot_model.py`` L1808; the transformer's ``timestep_scale`` 0.001
undoes it; the pipeline's UniPC flow timesteps are ``1000 sigma`` too)."""

SHIFT_BY_TIER = {"256": 3.0, "480": 5.0, "720": 10.0}
"""``nano_model_config.py`` L93 ``rectified_flow_training_config.shift``, looked up per sample by the
canvas tier (``utils/generator/image_resize.py`` ``get_vision_data_resolution``)."""

WAVER_MODE_S = 1.29  # rectified_flow.py TrainTimeSampler._WAVER_MODE_S


def canvas_tier(height: int, width: int) -> str:
    """cosmos-framework's resolution tier of a canvas (``get_vision_data_resolution``, min side)."""
    side = min(height, width)
    for tier, limit in (("256", 256), ("480", 640), ("720", 960)):
        if side <= limit:
            return tier
    raise ValueError(f"no training shift for a {height}x{width} canvas")


def resolution_tier_problem(tier: int, height: int, width: int) -> str | None:
    """Why diffusers' action pipeline would not size a ``height x width`` canvas at ``tier`` as is (it bins
    the canvas to one of the tier's sizes: ``CosmosActionCondition.resolution_tier``), or None."""
    from diffusers.pipelines.cosmos import pipeline_cosmos3_omni

    bins = getattr(pipeline_cosmos3_omni, "_ACTION_RESOLUTION_BINS", None)
    if bins is None:  # another diffusers layout: the processor's encode checks the binned size instead
        return None
    if str(tier) not in bins:
        return f"resolution_tier {tier} is not one of diffusers' action tiers {sorted(int(k) for k in bins)}"
    sizes = sorted(set(bins[str(tier)].values()))
    if (height, width) not in sizes:
        return (f"resolution_tier {tier} sizes canvases to {sizes}, not the {height}x{width} canvas: the policy "
                "would be trained (and served) on another image size")
    return None


def sample_sigma(distribution: str, shift: float, generator: torch.Generator | None) -> torch.Tensor:
    """One training sigma in [0, 1] (float32, 0-d, on the generator's device), as
    ``TrainTimeSampler.__call__`` draws it: ``rectified_flow.py`` L49-58 (the draw) and L88-90 (the
    shift ``s t / (1 + (s - 1) t)``).
    """
    device = generator_device(generator)
    if distribution not in SIGMA_DISTRIBUTIONS:
        raise ValueError(f"unknown sigma distribution {distribution!r}; choose one of {SIGMA_DISTRIBUTIONS}")
    if distribution == "logitnormal":
        draw = torch.randn((1,), generator=generator, device=device)
    else:
        draw = torch.rand((1,), dtype=torch.float32, generator=generator, device=device)
    return sigma_from_draw(distribution, shift, draw)[0]


def sigma_from_draw(distribution: str, shift: float, draw: torch.Tensor) -> torch.Tensor:
    """Training sigmas from float32 draws of any shape: a uniform in [0, 1) (``waver``, ``uniform``) or a
    standard normal (``logitnormal``), transformed as ``TrainTimeSampler`` does, then shifted.

    The shift is applied in float32 with the constants a float32 tensor would hold (``shift`` rounded, then
    ``shift - 1`` rounded), so the result does not depend on the draw's device or batch size.
    """
    if distribution == "waver":
        t = 1.0 - draw - WAVER_MODE_S * (torch.cos(torch.pi / 2.0 * draw) ** 2 - 1 + draw)
    elif distribution == "logitnormal":
        t = torch.sigmoid(draw)
    elif distribution == "uniform":
        t = draw
    else:
        raise ValueError(f"unknown sigma distribution {distribution!r}; choose one of {SIGMA_DISTRIBUTIONS}")
    shift32 = _float32(shift)
    return shift32 * t / (1 + _float32(shift32 - 1.0) * t)


def _float32(value: float) -> float:
    """``value`` rounded to float32 (what a float32 tensor of it holds)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def generator_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


@dataclass(frozen=True)
class PolicyConfig(ModelSettings):
    """What the policy is (its :class:`ModelSettings`, which serving must match) and how it is trained
    (NVIDIA's LIBERO recipe). Of the settings the policy itself uses the canvas, framing, horizon,
    frames, fps, domain and caption style; normalisation and gripper convention act on the actions
    outside it (data reader, rollout adapter)."""

    fps: float = float(RECIPE.fps)
    """As a float: what diffusers' pipeline and the caption take."""
    resolution_tier: int = 256
    """diffusers ``CosmosActionCondition.resolution_tier``; must bin to the canvas size."""
    main_image_key: str = "image"
    wrist_image_key: str = "wrist_image"
    sigma_distribution: str = "waver"
    """``nano_model_config.py`` L97 ``train_time_video_distribution``: how the (vision) sigma is drawn."""
    action_sigma_distribution: str | None = None
    """None: actions share the vision sigma (the recipe: ``independent_action_schedule=False``, so its
    ``train_time_action_distribution="logitnormal"`` is never used); a distribution: the action tokens
    get a sigma of their own, drawn with it (same shift) right after the vision sigma."""
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
    max_tokens_per_pack: int | None = DEFAULT_MAX_TOKENS_PER_PACK
    """Samples of a micro-batch share one transformer call up to this many tokens (document-masked
    attention, :mod:`~rlinf_cosmos3.models.cosmos3.packed_attention`); None: one call per sample (the
    reference path, bit-identical whatever the batch split)."""
    attention_backend: str = "auto"
    """Packed attention: ``flex`` (FlexAttention, GPU), ``loop`` (one SDPA call per sample) or ``auto``."""
    vae_batch_size: int = 8
    """Clips the frozen VAE encodes per call (memory bound of the batched encode)."""

    def __post_init__(self) -> None:
        for name in ("sigma_distribution", "action_sigma_distribution"):
            value = getattr(self, name)
            if value not in SIGMA_DISTRIBUTIONS and not (name == "action_sigma_distribution" and value is None):
                raise ValueError(f"{name} {value!r} not in {SIGMA_DISTRIBUTIONS}")
        if self.shift is not None and self.shift <= 0:
            raise ValueError(f"shift must be > 0 or None, got {self.shift}")
        problem = resolution_tier_problem(self.resolution_tier, self.canvas_height, self.canvas_width)
        if problem:
            raise ValueError(problem)
        if self.caption_style not in CAPTION_STYLES:
            raise ValueError(f"caption_style {self.caption_style!r} not in {CAPTION_STYLES}")
        if self.caption_style == "cosmos_framework" and self.view_point != CONCAT_VIEW:
            raise ValueError(f"caption_style 'cosmos_framework' describes a {CONCAT_VIEW} canvas, "
                             f"not view_point {self.view_point!r}")
        if not 0.0 <= self.caption_dropout < 1.0:
            raise ValueError(f"caption_dropout must be in [0, 1), got {self.caption_dropout}")
        if self.precision is not None:
            precision_dtype(self.precision)
        if self.max_tokens_per_pack is not None and self.max_tokens_per_pack < 1:
            raise ValueError(f"max_tokens_per_pack must be >= 1 or None, got {self.max_tokens_per_pack}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend {self.attention_backend!r} not in {ATTENTION_BACKENDS}")
        if self.vae_batch_size < 1:
            raise ValueError(f"vae_batch_size must be >= 1, got {self.vae_batch_size}")
        get_action_domain(self.domain_name)
        if self.num_frames != self.action_horizon + 1:
            raise ValueError(f"num_frames must be action_horizon + 1 = {self.action_horizon + 1} (the conditioning "
                             f"frame and one per action), got {self.num_frames}")

    @classmethod
    def from_settings(cls, settings: ModelSettings, **training: Any) -> PolicyConfig:
        """The policy of a model with ``settings``, trained with ``training`` (the other fields)."""
        return cls(**{**setting_values(settings), "fps": float(settings.fps)}, **training)

    @property
    def training_shift(self) -> float:
        return self.shift if self.shift is not None else SHIFT_BY_TIER[canvas_tier(self.canvas_height, self.canvas_width)]


def policy_config_from_sft(cfg: SFTConfig, *, precision: str) -> PolicyConfig:
    """The :class:`PolicyConfig` an SFT run trains with: its model settings (:func:`~rlinf_cosmos3.config.sft.
    sft_model_settings`) and ``actor.model``'s recipe (``precision``: the rank's compute precision)."""
    model = cfg.actor.model
    return PolicyConfig.from_settings(
        sft_model_settings(cfg),
        resolution_tier=model.resolution_tier,
        sigma_distribution=model.sigma_distribution,
        action_sigma_distribution=model.action_sigma_distribution,
        shift=model.shift,
        caption_dropout=model.caption_dropout,
        mask_padded_frames=model.mask_padded_frames,
        loss_scale=model.loss_scale,
        action_loss_weight=model.action_loss_weight,
        precision=precision if precision != "fp32" else None,
        max_tokens_per_pack=cfg.actor.max_tokens_per_pack,
        attention_backend=model.attention_backend,
    )


def sft_vae_dtype(on_gpu: bool) -> torch.dtype:
    """The frozen VAE's dtype in SFT: bf16 on GPU (as served), fp32 on CPU."""
    return torch.bfloat16 if on_gpu else torch.float32


def sft_latent_cache_key(cfg: SFTConfig, *, on_gpu: bool) -> dict[str, Any]:
    """What an SFT run's latent cache must have been made from (:func:`rlinf_cosmos3.data.latent_cache.cache_key`)."""
    from rlinf_cosmos3.data.latent_cache import cache_key

    model = cfg.actor.model
    return cache_key(
        cfg.data.dataset, model.model_path, vae_dtype=str(sft_vae_dtype(on_gpu)).removeprefix("torch."),
        canvas=(model.canvas_height, model.canvas_width), resolution_tier=model.resolution_tier,
    )
