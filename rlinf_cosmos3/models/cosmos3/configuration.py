"""What a Cosmos3 policy is (must match serving) and how it is trained (NVIDIA's LIBERO recipe).

The policy's config is its model settings (:class:`~rlinf_cosmos3.config.model_settings.ModelSettings`) and
its objective (:class:`~rlinf_cosmos3.config.objective.ObjectiveConfig`, which the SFT section ``actor.model``
inherits), each declared once in ``config/``; this module adds how a sigma is drawn and shifted
(cosmos-framework's ``rectified_flow.py`` ``TrainTimeSampler``, ``nano_model_config.py``'s shift per tier).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import torch

from rlinf_cosmos3.config.model_settings import CAPTION_STYLES, RECIPE, ModelSettings, setting_values
from rlinf_cosmos3.config.objective import SIGMA_DISTRIBUTIONS, ObjectiveConfig
from rlinf_cosmos3.config.sft import DEFAULT_MAX_TOKENS_PER_PACK, SFTConfig, sft_model_settings
from rlinf_cosmos3.models.cosmos3.captions import CONCAT_VIEW
from rlinf_cosmos3.models.cosmos3.domains import get_action_domain

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


def settings_problem(settings: ModelSettings, resolution_tier: int) -> tuple[str, str] | None:
    """``(setting, why)`` when a policy cannot be built with ``settings`` at ``resolution_tier``, else None.

    One check for the policy built by hand and for an SFT run before Ray (``validation.sft.preflight``, which
    names the config key of ``setting``): a caption style that is unknown or does not describe the canvas
    framing, an unknown action domain, a frame count that is not one per action plus the conditioning frame,
    a resolution tier that would resize the canvas.
    """
    if settings.caption_style not in CAPTION_STYLES:
        return "caption_style", f"unknown caption style '{settings.caption_style}'; use one of {list(CAPTION_STYLES)}"
    if settings.caption_style == "cosmos_framework" and settings.view_point != CONCAT_VIEW:
        return "caption_style", f"caption_style 'cosmos_framework' describes a {CONCAT_VIEW} canvas, not view_point " \
                                f"{settings.view_point!r}"
    try:
        get_action_domain(settings.domain_name)
    except KeyError as err:
        return "domain_name", str(err.args[0])
    if settings.num_frames != settings.action_horizon + 1:
        return "num_frames", (f"num_frames must be action_horizon + 1 = {settings.action_horizon + 1} (the "
                              f"conditioning frame and one per action), got {settings.num_frames}")
    problem = resolution_tier_problem(resolution_tier, settings.canvas_height, settings.canvas_width)
    return ("resolution_tier", problem) if problem else None


@dataclass(frozen=True)
class PolicyConfig(ModelSettings):
    """What the policy is (its :class:`ModelSettings`, which serving must match) and how it is trained
    (``objective``, NVIDIA's LIBERO recipe by default). Of the settings the policy itself uses the canvas,
    framing, horizon, frames, fps, domain and caption style; normalisation and gripper convention act on the
    actions outside it (data reader, rollout adapter)."""

    fps: float = float(RECIPE.fps)
    """As a float: what diffusers' pipeline and the caption take."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """How the policy is trained (sigma draws, shift, loss weights, caption dropout, padded frames, resolution
    tier, packed attention backend): the SFT run's ``actor.model`` objective fields."""
    main_image_key: str = "image"
    wrist_image_key: str = "wrist_image"
    precision: str | None = None
    """Dtype the noisy tokens enter the transformer in (``bf16`` under FSDP2 bf16 mixed precision);
    None: the transformer's parameter dtype. An SFT rank passes its compute precision (``actor.model.precision``
    on GPU, fp32 on CPU)."""
    max_tokens_per_pack: int | None = DEFAULT_MAX_TOKENS_PER_PACK
    """Samples of a micro-batch share one transformer call up to this many tokens (document-masked
    attention, :mod:`~rlinf_cosmos3.models.cosmos3.packed_attention`); None: one call per sample (the
    reference path, bit-identical whatever the batch split). An SFT run's ``actor.max_tokens_per_pack``."""
    vae_batch_size: int = 8
    """Clips the frozen VAE encodes per call (memory bound of the batched encode)."""

    def __post_init__(self) -> None:
        # Built by hand too (tests, RL, library use), not only from a validated run config: the same checks,
        # each declared once (the objective's in config/, the settings' above); precision, packing and the VAE
        # batch are checked where they are used.
        self.objective.validate("objective")
        problem = settings_problem(self, self.objective.resolution_tier)
        if problem is not None:
            raise ValueError(problem[1])

    @classmethod
    def from_settings(cls, settings: ModelSettings, **training: Any) -> PolicyConfig:
        """The policy of a model with ``settings``, trained with ``training`` (the other fields)."""
        return cls(**{**setting_values(settings), "fps": float(settings.fps)}, **training)

    @property
    def training_shift(self) -> float:
        shift = self.objective.shift
        return shift if shift is not None else SHIFT_BY_TIER[canvas_tier(self.canvas_height, self.canvas_width)]


def policy_config_from_sft(cfg: SFTConfig, *, precision: str) -> PolicyConfig:
    """The :class:`PolicyConfig` an SFT run trains with: its model settings (:func:`~rlinf_cosmos3.config.sft.
    sft_model_settings`), ``actor.model``'s objective and packing (``precision``: the rank's compute precision).
    Trusts ``cfg``: the driver validated it before Ray (:func:`rlinf_cosmos3.validation.sft.preflight`)."""
    return PolicyConfig.from_settings(
        sft_model_settings(cfg),
        objective=ObjectiveConfig.of(cfg.actor.model),
        precision=precision if precision != "fp32" else None,
        max_tokens_per_pack=cfg.actor.max_tokens_per_pack,
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
