"""One optimizer step of Cosmos3 SFT: what the FSDP worker runs and what the benchmarks time.

Randomness is reproducible on purpose: the flow-matching noise of a sample depends only on
``(seed, global step, dataset index)`` (:class:`~rlinf_cosmos3.models.cosmos3.keyed_noise.NoiseKeys`, drawn
by a counter-based generator on the device), so resuming, or splitting the same global batch over a different
number of ranks, draws the same noise.

Apart from the caller's ``synchronize`` (the timings), the host waits for the device inside the step once:
whether the gradient norm is finite (the recipe's ``force_finite`` must know before clipping). Losses stay
device tensors until the step's end, where they, the norm and the rank average come back in one transfer;
the noise is drawn on the device and the pack's index tensors are cached there, so no per-sample tensor
crosses from the host.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlinf_cosmos3.components.optim import clip_grad_norm_
from rlinf_cosmos3.models.cosmos3.keyed_noise import NoiseKeys, legacy_sample_seed

logger = logging.getLogger(__name__)


def sample_generators(seed: int, global_step: int, indexes: torch.Tensor) -> list[torch.Generator]:
    """One CPU generator per sample, seeded from (run seed, step, dataset index): rank-split invariant.

    The generator path of ``Cosmos3Policy.sft_loss`` (tests, FLOP counting); :func:`train_step` uses
    :class:`NoiseKeys`, which gives every sample's draws in one pass instead of one generator each."""
    return [torch.Generator().manual_seed(legacy_sample_seed(seed, global_step, int(i))) for i in indexes.tolist()]


@dataclass
class StepResult:
    """Rank-averaged losses of one optimizer step and where its time went."""

    loss: float
    vision_loss: float
    action_loss: float
    grad_norm: float
    lr: float
    forward_backward_s: float
    optimizer_s: float

    def metrics(self) -> dict[str, float]:
        return {
            "loss": self.loss,
            "vision_loss": self.vision_loss,
            "action_loss": self.action_loss,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
        }


def train_step(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    next_batch: Callable[[], Mapping[str, Any]],
    *,
    grad_accum_steps: int,
    seed: int,
    global_step: int,
    clip_grad: float,
    scheduler: Any | None = None,
    ema: Any | None = None,
    synchronize: Callable[[], None] = lambda: None,
) -> StepResult:
    """Zero grads, ``grad_accum_steps`` micro-batches through ``policy.sft_loss`` + backward, clip, step.

    ``next_batch`` yields the reader's batches (pixels or cached latents, with their ``index``);
    ``global_step`` is the step being taken (the noise keys use it); the LR scheduler and the EMA
    advance after the optimizer when given. Losses are averaged over micro-batches and ranks.
    """
    t0 = time.perf_counter()
    transformer = policy.transformer
    sums: torch.Tensor | None = None
    optimizer.zero_grad(set_to_none=True)
    for _ in range(grad_accum_steps):
        batch = next_batch()
        loss, parts = policy.sft_loss(batch, NoiseKeys(seed, global_step, batch["index"]))
        (loss / grad_accum_steps).backward()
        step_parts = torch.stack([parts["loss"], parts["vision_loss"], parts["action_loss"]]).double()
        sums = step_parts if sums is None else sums + step_parts
    assert sums is not None, "grad_accum_steps must be >= 1"
    synchronize()
    t1 = time.perf_counter()
    grad_norm = clip_grad_norm_(transformer, clip_grad)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    if ema is not None:
        ema.update(global_step + 1)
    synchronize()
    t2 = time.perf_counter()

    sums = sums / grad_accum_steps
    if dist.is_initialized() and dist.get_world_size() > 1:  # on the rank's device: NCCL takes no CPU tensors
        dist.all_reduce(sums)
        sums = sums / dist.get_world_size()
    loss_v, vision_v, action_v, norm_v = torch.cat([sums, grad_norm.double().reshape(1).to(sums.device)]).tolist()
    if not math.isfinite(norm_v):
        logger.warning("gradient norm is %s", norm_v)
    return StepResult(
        loss=loss_v, vision_loss=vision_v, action_loss=action_v, grad_norm=norm_v, lr=lr,
        forward_backward_s=t1 - t0, optimizer_s=t2 - t1,
    )
