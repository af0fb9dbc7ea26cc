"""FSDP2 sharding of the Cosmos3 transformer, as one pure function (torchtitan style).

``parallelize(model, mesh, cfg)`` applies, in this order:

1. activation checkpointing (optional): diffusers' own ``enable_gradient_checkpointing``, which
   wraps each decoder layer's call in non-reentrant ``torch.utils.checkpoint`` - per layer, like
   torchtitan's ``checkpoint_wrapper``, but without renaming parameters (checkpoint keys stay the
   diffusers names) - recomputing packed micro-batches under their packed layout
   (:func:`~rlinf_cosmos3.models.cosmos3.packed_attention.checkpoint_in_packed_layout`);
2. ``fully_shard`` on the modules diffusers keeps in fp32 (``_keep_in_fp32_modules``:
   ``time_embedder``) with an fp32 policy, so under bf16 training they compute in fp32 exactly as
   at inference;
3. ``fully_shard`` on each decoder layer, then on the transformer root.

Only the transformer is touched; a policy's frozen VAE stays a plain, replicated module. With
``precision="bf16"`` parameters stay fp32 in the shards (the optimizer's master weights) and are
gathered as bf16 for compute, gradients reduced in fp32. The root does not cast its inputs:
position ids (float, fps-modulated) and timesteps must stay fp32, as the diffusers pipeline
passes them; the caller hands the noisy tokens in the compute dtype, as the pipeline does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from rlinf_cosmos3.config.base import PRECISIONS
from rlinf_cosmos3.models.cosmos3.packed_attention import checkpoint_in_packed_layout

logger = logging.getLogger(__name__)

PRECISION_DTYPES: dict[str, torch.dtype] = dict(zip(PRECISIONS, (torch.bfloat16, torch.float32), strict=True))
"""Each of ``config.base.PRECISIONS``, by name, as the torch dtype it means."""


def precision_dtype(precision: str) -> torch.dtype:
    """``"bf16"``/``"fp32"`` -> torch dtype; the error lists the choices."""
    if precision not in PRECISION_DTYPES:
        raise ValueError(f"unknown precision {precision!r}; choose one of {sorted(PRECISION_DTYPES)}")
    return PRECISION_DTYPES[precision]


@dataclass(frozen=True)
class ParallelizeConfig:
    """How to shard: compute precision, activation checkpointing, resharding after forward, and
    whether each decoder block is compiled. Compiling the blocks and keeping gathered parameters
    until backward both make a GPU step faster, at more memory; the measured step times are in
    docs/benchmarks.md ("SFT step: FSDP2 on the Cosmos3 transformer at Nano width")."""

    precision: str = "fp32"
    """``bf16``: bf16 compute with fp32 sharded parameters and fp32 gradient reduction (GPU);
    ``fp32``: no mixed precision (CPU, tests)."""
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True
    """Free gathered parameters after each forward (ZeRO-3); False keeps them until backward."""
    compile_blocks: bool = False
    """``torch.compile`` each decoder block's forward before sharding (parameter names unchanged)."""

    def __post_init__(self) -> None:
        precision_dtype(self.precision)


def _transformer_of(model: nn.Module) -> nn.Module:
    """The transformer inside a policy (``model.transformer``), or the model itself."""
    transformer = getattr(model, "transformer", model)
    if not hasattr(transformer, "layers"):
        raise TypeError(f"{type(model).__name__} has no decoder `layers` to shard")
    return transformer


def parallelize(model: nn.Module, mesh: DeviceMesh | None, cfg: ParallelizeConfig) -> nn.Module:
    """Shard ``model``'s transformer over ``mesh`` (in place, like ``fully_shard``) and return ``model``.

    ``mesh`` None: one process, nothing is sharded (only activation checkpointing applies).
    Parameters may still be on the meta device; materialise and load them afterwards with
    :func:`rlinf_cosmos3.models.cosmos3.loading.load_transformer_weights`.
    """
    transformer = _transformer_of(model)
    if cfg.activation_checkpointing:
        transformer.enable_gradient_checkpointing(checkpoint_in_packed_layout)
    if cfg.compile_blocks:
        # Compile each block's forward in place: FSDP2's hooks stay outside the compiled code (as with
        # torchtitan's compiled-then-sharded blocks) and parameter names, hence checkpoints, loading
        # and export, are unchanged (a torch.compile wrapper module would prefix them `_orig_mod.`).
        for layer in transformer.layers:
            layer.forward = torch.compile(layer.forward)
    if mesh is None:
        return model

    compute = precision_dtype(cfg.precision)
    mixed = compute != torch.float32
    layer_policy = (
        MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32) if mixed else MixedPrecisionPolicy()
    )
    root_policy = MixedPrecisionPolicy(
        param_dtype=compute if mixed else None,
        reduce_dtype=torch.float32 if mixed else None,
        cast_forward_inputs=False,
    )
    fp32_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)

    for name in getattr(transformer, "_keep_in_fp32_modules", None) or []:
        module = getattr(transformer, name, None)
        if isinstance(module, nn.Module):
            fully_shard(module, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=fp32_policy)
    for layer in transformer.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=layer_policy)
    fully_shard(transformer, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=root_policy)
    logger.info(
        "FSDP2: %d decoder layers + root sharded over %d ranks (precision %s, activation checkpointing %s, "
        "reshard after forward %s, compiled blocks %s)",
        len(transformer.layers),
        mesh.size(),
        cfg.precision,
        cfg.activation_checkpointing,
        cfg.reshard_after_forward,
        cfg.compile_blocks,
    )
    return model
