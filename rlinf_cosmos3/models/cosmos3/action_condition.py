"""Hand our registered action widths to diffusers' Cosmos3 pipeline without patching diffusers.

``CosmosActionCondition.__post_init__`` (diffusers 0.42.1) resolves ``raw_action_dim`` from a
private table that has no ``libero`` entry and offers no hook to extend it. The pipeline itself,
however, only reads ``action.raw_action_dim`` (noise masking, velocity masking, output slicing).
So we subclass the condition: same fields, same checks, but the width comes from
:mod:`rlinf_cosmos3.models.cosmos3.domains`. The domain *id* is still looked up by diffusers from
the name; we check at construction that it is the id we registered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    _ACTION_RESOLUTION_BINS,
    _EMBODIMENT_TO_DOMAIN_ID,
    CosmosActionCondition,
)

from rlinf_cosmos3.models.cosmos3.domains import ACTION_HORIZON, LIBERO_DOMAIN_NAME, get_action_domain

_MODES = ("policy", "forward_dynamics", "inverse_dynamics")


@dataclass
class RegisteredActionCondition(CosmosActionCondition):
    """``CosmosActionCondition`` for domains registered in ``domains.py`` (e.g. libero → 10 channels)."""

    def __post_init__(self) -> None:
        domain = get_action_domain(self.domain_name)
        library_id = _EMBODIMENT_TO_DOMAIN_ID.get(self.domain_name)
        if library_id != domain.domain_id:
            raise ValueError(
                f"domain {self.domain_name!r}: registered id {domain.domain_id} but diffusers uses {library_id}"
            )
        if self.mode not in _MODES:
            raise ValueError(f"unsupported action mode {self.mode!r}; expected one of {list(_MODES)}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if str(self.resolution_tier) not in _ACTION_RESOLUTION_BINS:
            raise ValueError(
                f"unsupported resolution_tier {self.resolution_tier!r}; "
                f"expected one of {sorted(int(k) for k in _ACTION_RESOLUTION_BINS)}"
            )
        if (self.image is None) == (self.video is None):
            raise ValueError("give exactly one of `image` and `video`")
        if self.mode == "inverse_dynamics" and self.video is None:
            raise ValueError("mode 'inverse_dynamics' needs `video`")
        self.raw_action_dim = domain.raw_action_dim
        if self.mode == "forward_dynamics":
            if self.raw_actions is None or self.raw_actions.ndim != 2 or self.raw_actions.shape[0] < 1:
                raise ValueError("mode 'forward_dynamics' needs `raw_actions` of shape [T>=1, raw_action_dim]")
            if self.raw_actions.shape[1] != self.raw_action_dim:
                raise ValueError(
                    f"raw_actions width {self.raw_actions.shape[1]} != {self.raw_action_dim} "
                    f"registered for domain {self.domain_name!r}"
                )


def policy_condition(
    image: Any,
    *,
    domain_name: str = LIBERO_DOMAIN_NAME,
    chunk_size: int = ACTION_HORIZON,
    resolution_tier: int = 256,
    view_point: str = "ego_view",
) -> RegisteredActionCondition:
    """Condition for one policy call: one observation image in, ``[chunk_size, raw_action_dim]`` out.

    A uint8 ``[H, W, 3]`` array (or tensor) is handed to diffusers as a PIL image: diffusers 0.42.1
    reads uint8 arrays as if already scaled to [0, 1], which would feed the VAE values up to 509.

    Tier 256 maps a LIBERO side-by-side observation (two 256x256 views, aspect 2:1) onto the
    320x192 canvas of the reference eval config.
    """
    return RegisteredActionCondition(
        mode="policy",
        chunk_size=chunk_size,
        domain_name=domain_name,
        resolution_tier=resolution_tier,
        image=as_pil_if_uint8(image),
        view_point=view_point,
    )


def as_pil_if_uint8(image: Any) -> Any:
    """uint8 HWC pixels (numpy or torch) -> PIL image; anything else unchanged."""
    import numpy as np
    from PIL import Image

    if hasattr(image, "detach") and str(getattr(image, "dtype", "")) == "torch.uint8":
        image = image.detach().cpu().numpy()
    if isinstance(image, np.ndarray) and image.dtype == np.uint8:
        return Image.fromarray(image)
    return image
