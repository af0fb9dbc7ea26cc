"""Cosmos3 (diffusers) glue: the action-domain registry, action conditions, random test models.

Only the light domain constants are re-exported here, so importing the package stays cheap;
import ``action_condition`` or ``tiny`` explicitly when you need diffusers.
"""

from rlinf_cosmos3.models.cosmos3.domains import (
    ACTION_DOMAINS,
    ACTION_HORIZON,
    LIBERO_DOMAIN_ID,
    LIBERO_DOMAIN_NAME,
    LIBERO_RAW_ACTION_DIM,
    ActionDomain,
    get_action_domain,
)

__all__ = [
    "ACTION_DOMAINS",
    "ACTION_HORIZON",
    "LIBERO_DOMAIN_ID",
    "LIBERO_DOMAIN_NAME",
    "LIBERO_RAW_ACTION_DIM",
    "ActionDomain",
    "get_action_domain",
]
