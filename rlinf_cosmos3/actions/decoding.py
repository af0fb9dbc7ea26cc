"""The model's normalised 10-D output -> the 7-D commands LIBERO executes.

One decoder for every consumer, so what an env runs cannot depend on who sampled the chunk: the eval's action
adapter (:class:`rlinf_cosmos3.workers.rollout.adapter.Cosmos3ActionAdapter`, SGLang and embedded backends
alike) and the RL rollout sampler (:mod:`rlinf_cosmos3.rl.rollout_sampler`, the actor's own weights). The
steps, each the library's convention: de-normalise with the training stats (``quantile_rot``), rot6d ->
axis-angle (``svd`` or ``gram_schmidt``), the gripper rule of the training data's convention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from rlinf_cosmos3.actions.conversion import GRIPPER_INDEX_7, actions_10_to_7
from rlinf_cosmos3.actions.gripper import dataset_gripper_to_libero_command
from rlinf_cosmos3.actions.normalization import ActionNormalizer


@dataclass(frozen=True)
class EnvActionDecoder:
    """Normalised ``[..., 10]`` model actions -> ``[..., 7]`` float32 LIBERO commands (gripper -1 open / +1 close)."""

    normalizer: ActionNormalizer
    """The training run's stats and method."""
    rot6d_decode: str = "svd"
    gripper_convention: str = "zero_one"
    """How the training data stored the gripper."""
    gripper_command: str = "binary"

    def __call__(self, normalized: ArrayLike) -> np.ndarray:
        """Decode in float64, return float32; a non-finite model output is an error, not a command."""
        normalized = np.asarray(normalized, dtype=np.float64)
        if not np.isfinite(normalized).all():
            raise ValueError("the model returned non-finite actions")
        actions = actions_10_to_7(self.normalizer.denormalize(normalized), self.rot6d_decode)
        actions[..., GRIPPER_INDEX_7] = dataset_gripper_to_libero_command(
            actions[..., GRIPPER_INDEX_7], self.gripper_convention, self.gripper_command)
        return actions.astype(np.float32)
