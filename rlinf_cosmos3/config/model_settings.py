"""The settings that make a trained model what it is, each declared once, with the LIBERO recipe's value.

A Cosmos3 policy trained at 20 fps on a 192x320 ``concat_view`` canvas with 16-step chunks, normalised
with ``quantile_rot`` and a ``zero_one`` gripper, gives wrong actions -- and no error -- when it is served
with another value of any of them. :class:`ModelSettings` declares them (name, type, recipe value) and
nothing else does: every config section that sets one takes its default from :data:`RECIPE` and lists,
in a table of its own, the key that carries each (``data.dataset.chunk_length`` is the action horizon,
``rollout.model.height`` the canvas height, ...); :func:`read_settings` is the one way from a config to
its settings. Built on it: the policy's
:class:`~rlinf_cosmos3.models.cosmos3.configuration.PolicyConfig` (the settings plus the training
recipe) and the record a trained model carries,
:class:`~rlinf_cosmos3.models.cosmos3.identity.ModelIdentity` (the settings plus the stats file's hash).

Standard library only: configs read it, and so do ``actions/`` and ``models/`` in every environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

NORMALIZATIONS = ("quantile_rot",)
"""Action normalisation methods (:mod:`rlinf_cosmos3.actions.normalization` applies them)."""
GRIPPER_CONVENTIONS = ("zero_one", "pm_one", "pm_one_flip")
"""How a dataset stores the gripper (:mod:`rlinf_cosmos3.actions.gripper`); ``zero_one`` is ours and NVIDIA's."""
CAPTION_STYLES = ("diffusers", "cosmos_framework")
"""The action caption a policy is trained and prompted with (:mod:`rlinf_cosmos3.models.cosmos3.captions`)."""


@dataclass(frozen=True)
class ModelSettings:
    """What training fixes and serving must repeat exactly; the defaults are the LIBERO recipe's."""

    fps: int = 20
    action_horizon: int = 16
    """Actions predicted per chunk."""
    num_frames: int = 17
    """Video frames per sample: the conditioning frame plus one per action."""
    canvas_height: int = 192
    canvas_width: int = 320
    """The 256-tier canvas of a 2:1 side-by-side LIBERO observation."""
    view_point: str = "concat_view"
    """Framing sentence of the action caption (main and wrist view side by side)."""
    normalization: str = "quantile_rot"
    """Action normalisation method, one of :data:`NORMALIZATIONS`."""
    domain_name: str = "libero"
    """Embodiment domain of the action head (:mod:`rlinf_cosmos3.models.cosmos3.domains`)."""
    caption_style: str = "diffusers"
    """One of :data:`CAPTION_STYLES`."""
    gripper_convention: str = "zero_one"
    """How the training data stored the gripper, one of :data:`GRIPPER_CONVENTIONS`."""


RECIPE = ModelSettings()
"""The LIBERO recipe's settings: the default of every config field that sets one."""
NUM_INFERENCE_STEPS = 30
"""Denoising steps per action request: NVIDIA's LIBERO eval samples with 30 UniPC steps
(docs/action_conventions.md §7). A serving choice, not a model setting (not part of the identity): the
default of ``rollout.model.num_inference_steps`` and of ``Cosmos3Policy.predict``."""
SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ModelSettings))


def setting_values(settings: ModelSettings) -> dict[str, Any]:
    """Setting name -> value of ``settings`` (also of a subclass: only the :class:`ModelSettings` fields)."""
    return {name: getattr(settings, name) for name in SETTING_NAMES}


def read_settings(config: object, keys: Mapping[str, str], base: ModelSettings = RECIPE) -> ModelSettings:
    """The settings ``config`` declares, read through ``keys`` (setting name -> dotted key in ``config``);
    a setting ``keys`` does not name is ``base``'s."""
    unknown = sorted(set(keys) - set(SETTING_NAMES))
    if unknown:
        raise KeyError(f"not model settings: {unknown}; they are {list(SETTING_NAMES)}")
    values = {}
    for name, key in keys.items():
        value = config
        for part in key.split("."):
            value = getattr(value, part)
        values[name] = value
    return replace(base, **values)
