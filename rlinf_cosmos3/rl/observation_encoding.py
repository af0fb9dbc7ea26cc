"""Env observations -> what the RL chain is conditioned on: the condition latents and the prompt token ids.

Why this module exists: the rollout policy must be the policy the eval measures. So an observation reaches
the in-process chain (:func:`~rlinf_cosmos3.rl.action_chain.sample_action_chain`) exactly as the eval's
embedded backend hands it to the diffusers pipeline, and every step is the library's own code, none redone:

* canvas: :func:`~rlinf_cosmos3.models.cosmos3.observation.compose_observation` of the upright ``[main | wrist]``
  views (what ``Cosmos3ActionAdapter.compose`` calls, with the policy's canvas size);
* latents: :meth:`PolicyProcessor.encode_canvases`, i.e. the pipeline's ``_prepare_action_video_conditioning``,
  ``_encode_video`` and padding cut. The pipeline holds the canvas over the 17-frame clip and encodes all of it,
  but only latent frame 0 is the condition: the later latent frames start from noise. The Wan VAE encodes a
  clip's frame 0 in a chunk of its own (``AutoencoderKLWan._encode``), so the canvas is encoded alone
  (``num_frames=1``): the same frame-0 latent, bit for bit (tested against the pipeline's held clip), for a
  fraction of the VAE's work (docs/benchmarks.md, "Encoding an RL observation"). The later frames of
  :attr:`EncodedObservations.latents` are zeros that only give the chain's state its shape;
* prompt: :meth:`PolicyProcessor.eval_prompt_ids`: the adapter's request text in the model's caption style,
  tokenized as the pipeline tokenizes it (no system prompt, conditional ids only: guidance 1.0).

The fields are the ones the eval's adapter reads from an env stage (``main_images``, ``wrist_images``,
``task_descriptions``); the proprioceptive state is not an input of the Cosmos3 policy.
``tests/test_rl_observation_encoding.py`` compares both with what the embedded backend's pipeline uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlinf_cosmos3.models.cosmos3.observation import compose_observation

__all__ = ["EncodedObservations", "compose_canvases", "encode_observations"]


@dataclass
class EncodedObservations:
    """A batch of observations as the chain takes them."""

    latents: torch.Tensor
    """``[B, C, T_latent, h, w]`` float32 on the policy's device: frame 0 the condition (the clean latent of the
    canvas, as the pipeline conditions on it), the later frames zero (the chain draws them from noise)."""
    input_ids: list[list[int]]
    """Each observation's prompt token ids (the eval's caption)."""
    canvases: np.ndarray
    """``[B, H, W, 3]`` uint8: the composed canvases (what an eval request would carry)."""

    def __len__(self) -> int:
        return len(self.input_ids)


def compose_canvases(policy: Any, main_images: Any, wrist_images: Any) -> np.ndarray:
    """``[B, h, w, 3]`` uint8 upright main and wrist views -> ``[B, H, W, 3]`` uint8 policy canvases."""
    cfg = policy.cfg
    return np.asarray(compose_observation(np.asarray(main_images), np.asarray(wrist_images),
                                          height=cfg.canvas_height, width=cfg.canvas_width, channels_last=True))


@torch.no_grad()
def encode_observations(policy: Any, main_images: Any, wrist_images: Any,
                        task_descriptions: Sequence[str]) -> EncodedObservations:
    """A batch of env observations (``[B, h, w, 3]`` uint8 views, ``B`` task strings) -> condition latents and
    prompt ids for :func:`~rlinf_cosmos3.rl.action_chain.sample_action_chain` (see the module docstring)."""
    main, wrist = np.asarray(main_images), np.asarray(wrist_images)
    if not len(task_descriptions) == len(main) == len(wrist):
        raise ValueError(f"observation batch sizes differ: {len(task_descriptions)} tasks, {len(main)} main images, "
                         f"{len(wrist)} wrist images")
    canvases = compose_canvases(policy, main, wrist)
    clips = torch.from_numpy(canvases).permute(0, 3, 1, 2).unsqueeze(1)  # [B, 1, 3, H, W]
    condition = policy.processor.encode_canvases(clips, num_frames=1).float()
    frames = (policy.cfg.num_frames - 1) // policy.pipeline.vae_scale_factor_temporal + 1
    latents = torch.zeros(*condition.shape[:2], frames, *condition.shape[3:], dtype=torch.float32,
                          device=condition.device)
    latents[:, :, :1] = condition
    input_ids = [policy.processor.eval_prompt_ids(str(task)) for task in task_descriptions]
    return EncodedObservations(latents=latents, input_ids=input_ids, canvases=canvases)
