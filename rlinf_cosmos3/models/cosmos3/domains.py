"""The one place where embodiment domains get the raw action width diffusers lacks.

diffusers 0.42.1 knows ``libero`` as embodiment domain 5 (it selects the domain-aware action
projection weights) but leaves it out of its width table, because LIBERO's width depends on the
dataset's rotation encoding. Ours is fixed by the conventions in docs/action_conventions.md:
``[dpos(3), rot6d(6), gripper(1)]`` = 10 channels, predicted 16 steps at a time.

This module imports nothing heavy, so configs and clients can read the constants without
pulling in torch or diffusers. :mod:`rlinf_cosmos3.models.cosmos3.action_condition` hands the
width to the diffusers pipeline; SGLang takes it per request as ``raw_action_dim``.
"""

from __future__ import annotations

from dataclasses import dataclass

# NUM_INFERENCE_STEPS is declared with the recipe (rollout.model reads its default there) and offered here
# too, for Cosmos3Policy.predict.
from rlinf_cosmos3.config.model_settings import NUM_INFERENCE_STEPS as NUM_INFERENCE_STEPS
from rlinf_cosmos3.config.model_settings import RECIPE

LIBERO_DOMAIN_NAME = "libero"
LIBERO_DOMAIN_ID = 5
LIBERO_RAW_ACTION_DIM = 10
ACTION_HORIZON = RECIPE.action_horizon


@dataclass(frozen=True)
class ActionDomain:
    """An embodiment as the model sees it: which action head, how many real channels."""

    name: str
    domain_id: int
    raw_action_dim: int


# Domains whose width we define ourselves (diffusers has their id but no width).
ACTION_DOMAINS: dict[str, ActionDomain] = {
    LIBERO_DOMAIN_NAME: ActionDomain(LIBERO_DOMAIN_NAME, LIBERO_DOMAIN_ID, LIBERO_RAW_ACTION_DIM),
}


def get_action_domain(name: str) -> ActionDomain:
    """Look a domain up by name; the error lists what is registered."""
    try:
        return ACTION_DOMAINS[name]
    except KeyError:
        raise KeyError(
            f"no raw action width registered for domain {name!r}; registered: {sorted(ACTION_DOMAINS)} "
            "(add it in rlinf_cosmos3/models/cosmos3/domains.py)"
        ) from None
