"""Stored 7-D actions -> the normalised 10-D chunk a Cosmos3 model is trained to output.

One function for both consumers, so they cannot drift apart: the SFT data path
(:class:`rlinf_cosmos3.data.dataset.LiberoSFTDataset`, the training targets) and the ``replay``
rollout backend (which answers eval requests with recorded actions encoded exactly like those
targets, to check the eval's decoding conventions without a model).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from rlinf_cosmos3.actions.conversion import actions_7_to_10
from rlinf_cosmos3.actions.normalization import ActionNormalizer


def encode_model_actions(actions_7: ArrayLike, normalizer: ActionNormalizer) -> tuple[np.ndarray, np.ndarray]:
    """``[..., 7]`` stored actions (gripper as stored) -> (normalised ``[..., 10]`` float32, raw ``[..., 10]``
    float64); the maths runs in float64, the raw actions are returned for callers that count idle steps."""
    a10 = actions_7_to_10(np.asarray(actions_7, dtype=np.float64))
    return normalizer.normalize(a10).astype(np.float32), a10
