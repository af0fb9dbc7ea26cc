"""One optimizer step of Cosmos3 SFT: what the FSDP worker runs and what the benchmarks time.

Randomness is reproducible on purpose: the flow-matching noise of a sample depends only on
``(seed, global step, dataset index)`` (:func:`sample_generators`), so resuming, or splitting the same
global batch over a different number of ranks, draws the same noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlinf_cosmos3.components.optim import clip_grad_norm

_NOISE_SEED_STRIDE = 1_000_003


def sample_generators(seed: int, global_step: int, indexes: torch.Tensor) -> list[torch.Generator]:
    """One CPU generator per sample, seeded from (run seed, step, dataset index): rank-split invariant."""
    base = (seed * _NOISE_SEED_STRIDE + global_step) * _NOISE_SEED_STRIDE
    return [torch.Generator().manual_seed(base + int(i)) for i in indexes.tolist()]


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
    ``global_step`` is the step being taken (the noise seeds use it); the LR scheduler and the EMA
    advance after the optimizer when given. Losses are averaged over micro-batches and ranks.
    """
    t0 = time.perf_counter()
    transformer = policy.transformer
    device = next(p for p in policy.vae.parameters()).device
    sums = torch.zeros(3, dtype=torch.float64)
    optimizer.zero_grad(set_to_none=True)
    for _ in range(grad_accum_steps):
        batch = next_batch()
        generators = sample_generators(seed, global_step, batch["index"])
        loss, parts = policy.sft_loss(batch, generators)
        (loss / grad_accum_steps).backward()
        sums += torch.tensor([float(parts["loss"]), float(parts["vision_loss"]), float(parts["action_loss"])],
                             dtype=torch.float64)
    synchronize()
    t1 = time.perf_counter()
    grad_norm = clip_grad_norm(transformer, clip_grad)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    if ema is not None:
        ema.update(global_step + 1)
    synchronize()
    t2 = time.perf_counter()

    sums /= grad_accum_steps
    if dist.is_initialized() and dist.get_world_size() > 1:  # on the rank's device: NCCL takes no CPU tensors
        sums = sums.to(device)
        dist.all_reduce(sums)
        sums = sums.cpu() / dist.get_world_size()
    return StepResult(
        loss=float(sums[0]), vision_loss=float(sums[1]), action_loss=float(sums[2]), grad_norm=grad_norm, lr=lr,
        forward_backward_s=t1 - t0, optimizer_s=t2 - t1,
    )
