"""What one SFT rank holds for a step, built one way for the FSDP worker and for the step benchmark.

The benchmark (``benchmarks/gpu/sft_step.py``) must time exactly what the worker runs, so both call
:func:`build_sft_policy` and :func:`build_sft_optimization`: with a copy of this set-up of its own, the
benchmark could measure another model than the one the worker trains (the launcher-vs-benchmark
comparison in docs/benchmarks.md).

Start-up never holds the whole transformer on one device: it is built on the meta device, sharded
with :func:`parallelize`, then materialised shard by shard while rank 0 streams the weights in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh

from rlinf_cosmos3.components.ema import PowerEMA
from rlinf_cosmos3.components.optim import (
    TrainableSelection,
    build_optimizer,
    lambda_linear_schedule,
    select_trainable,
)
from rlinf_cosmos3.config.sft import SFTConfig
from rlinf_cosmos3.models.cosmos3.configuration import policy_config_from_sft, sft_vae_dtype
from rlinf_cosmos3.models.cosmos3.loading import load_transformer_weights
from rlinf_cosmos3.models.cosmos3.parallelize import ParallelizeConfig, parallelize, precision_dtype
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy

__all__ = ["SFTOptimization", "build_sft_optimization", "build_sft_policy", "sft_precision"]


def sft_precision(cfg: SFTConfig, device: torch.device) -> str:
    """The configured precision on a GPU; fp32 on CPU (bf16 matmuls there are slow and only for tests)."""
    return cfg.actor.model.precision if device.type == "cuda" else "fp32"


def build_sft_policy(
    cfg: SFTConfig, device: torch.device, world_size: int
) -> tuple[Cosmos3Policy, TrainableSelection]:
    """The policy of ``actor.model.model_path``: sharded over ``world_size`` ranks, weights loaded, in
    train mode, the recipe's trainable selection applied. Call on every rank (collective)."""
    model_cfg = cfg.actor.model
    precision = sft_precision(cfg, device)
    policy = Cosmos3Policy.from_pretrained(
        model_cfg.model_path,
        policy_config_from_sft(cfg, precision=precision),
        device=device,
        transformer_on_meta=True,
        vae_dtype=sft_vae_dtype(device.type == "cuda"),
    )
    # FSDP2 is also what applies mixed precision (bf16 compute over fp32 master weights), so one GPU
    # gets a one-rank mesh too; only a single fp32 process runs unsharded.
    mixed = precision_dtype(precision) != torch.float32
    mesh = init_device_mesh(device.type, (world_size,)) if world_size > 1 or mixed else None
    parallelize(
        policy,
        mesh,
        ParallelizeConfig(
            precision=precision,
            activation_checkpointing=model_cfg.activation_checkpointing,
            reshard_after_forward=model_cfg.reshard_after_forward,
            compile_blocks=model_cfg.compile_blocks,
        ),
    )
    load_transformer_weights(policy.transformer, model_cfg.model_path, device=device)
    policy.transformer.train()
    selection = select_trainable(policy.transformer, model_cfg.keys_to_select)
    return policy, selection


@dataclass
class SFTOptimization:
    """AdamW over the trainable parameters, its warm-up/linear-decay schedule and the EMA of the weights."""

    optimizer: torch.optim.AdamW
    scheduler: Any
    ema: PowerEMA


def build_sft_optimization(
    transformer: torch.nn.Module, cfg: SFTConfig, *, implementation: str | None = None
) -> SFTOptimization:
    """The recipe's optimizer, schedule and EMA for a transformer after :func:`build_sft_policy`.

    ``implementation`` picks AdamW's kernel (``fused``/``foreach``; None: the library's choice)."""
    model_cfg, optim_cfg = cfg.actor.model, cfg.actor.optim
    optimizer = build_optimizer(
        transformer,
        optim_cfg.lr,
        optim_cfg.weight_decay,
        tuple(optim_cfg.betas),
        optim_cfg.eps,
        model_cfg.lr_multipliers,
        implementation=implementation,
    )
    scheduler = lambda_linear_schedule(
        optimizer, optim_cfg.lr_warmup_steps, optim_cfg.total_training_steps, min_lr_rate=optim_cfg.min_lr_rate
    )
    ema = PowerEMA(transformer, rate=model_cfg.ema_rate, enabled=model_cfg.ema_enabled)
    return SFTOptimization(optimizer, scheduler, ema)
