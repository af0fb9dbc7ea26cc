"""How the policy is trained: the flow-matching objective's knobs, declared once for the config and the policy.

The SFT section ``actor.model`` inherits these fields (its keys stay ``actor.model.sigma_distribution``, ...),
and the policy's :class:`~rlinf_cosmos3.models.cosmos3.configuration.PolicyConfig` holds one as ``objective``.
So a knob added here is a YAML key and a policy setting at once, with one value check
(:meth:`ObjectiveConfig.validate`), and nothing copies it field by field (docs/sft_objective.md).

The defaults are NVIDIA's LIBERO recipe (cosmos-framework): ``nano_model_config.py`` (sigma distribution,
shift per canvas tier, action loss weight), ``action_policy_libero_all_nano.py`` (loss scale, caption
dropout), ``rectified_flow.py`` (``TrainTimeSampler``: how a training sigma is drawn).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from rlinf_cosmos3.config.base import require

SIGMA_DISTRIBUTIONS = ("waver", "logitnormal", "uniform")
"""How a training sigma can be drawn (``models/cosmos3/configuration.py`` ``sample_sigma``)."""
ATTENTION_BACKENDS = ("auto", "flex", "loop")
"""``attention_backend``: the packed attention backends of ``models/cosmos3/packed_attention.py``."""


@dataclass
class ObjectiveConfig:
    """The training objective of the policy and how its packed forward attends; the recipe's values."""

    resolution_tier: int = 256
    """diffusers' action resolution tier the canvas is sized by (``CosmosActionCondition.resolution_tier``);
    it must size ``canvas_height x canvas_width`` as is (256 for the 192x320 LIBERO canvas)."""
    sigma_distribution: str = "waver"
    """How a training sigma is drawn (the recipe's ``train_time_video_distribution``): ``waver``,
    ``logitnormal`` or ``uniform``."""
    action_sigma_distribution: str | None = None
    """null: the action tokens share the vision sigma (the recipe: ``independent_action_schedule=False``);
    a distribution: actions get their own sigma, drawn with it right after the vision sigma (same shift)."""
    shift: float | None = None
    """Sigma shift ``s t / (1 + (s - 1) t)``; null: the recipe's by canvas tier (3.0 for 192x320)."""
    caption_dropout: float = 0.0
    """Chance a sample trains on the unconditional prompt. NVIDIA trains with 0.1 to enable
    classifier-free guidance; our serving runs guidance 1.0 (no unconditional pass), so the default
    spends no samples on it (docs/sft_objective.md)."""
    mask_padded_frames: bool = True
    """Leave latent frames made only of episode-end padding out of the vision loss."""
    loss_scale: float = 10.0
    """Flow-matching loss weight (cosmos-framework LIBERO recipe: ``loss_scale = 10``); actions get
    ``loss_scale * action_loss_weight``."""
    action_loss_weight: float = 1.0
    """Weight of the action MSE relative to the vision MSE (10 x 1.0 = NVIDIA's absolute action weight 10)."""
    attention_backend: str = "auto"
    """Attention of packed samples: ``flex`` (FlexAttention, GPU), ``loop`` (one SDPA call per sample,
    any device) or ``auto`` (flex on GPU, loop on CPU)."""

    def validate(self, root: str = "actor.model") -> None:
        """The objective's values; raises :class:`~rlinf_cosmos3.config.base.ConfigError` naming
        ``<root>.<field>`` and the fix."""
        require(self.attention_backend in ATTENTION_BACKENDS, f"{root}.attention_backend",
                f"unknown backend '{self.attention_backend}'", f"use one of {list(ATTENTION_BACKENDS)}")
        for name in ("sigma_distribution", "action_sigma_distribution"):
            value, shared = getattr(self, name), name == "action_sigma_distribution"
            require(value in SIGMA_DISTRIBUTIONS or (value is None and shared), f"{root}.{name}",
                    f"unknown distribution '{value}'",
                    f"use one of {list(SIGMA_DISTRIBUTIONS)}" + (" or null (share the vision sigma)" if shared else ""))
        require(self.shift is None or self.shift > 0, f"{root}.shift", f"must be > 0 or null, got {self.shift}",
                "use null (the recipe's shift for the canvas tier: 3.0 for 192x320) or a positive number")
        require(0.0 <= self.caption_dropout < 1.0, f"{root}.caption_dropout",
                f"must be in [0, 1), got {self.caption_dropout}", "use 0.0 (the default) or 0.1 (NVIDIA's recipe)")

    @classmethod
    def of(cls, section: Any) -> ObjectiveConfig:
        """The objective a config section carries (``actor.model`` is one): its fields of this class, copied."""
        return cls(**{f.name: getattr(section, f.name) for f in fields(cls)})
