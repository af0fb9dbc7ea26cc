"""Optimizer, LR schedule and gradient clipping for SFT, following NVIDIA's cosmos-framework recipe.

Sources (cosmos-framework, read at the fetched HEAD):

* ``cosmos_framework/utils/generator/optimizer.py`` — ``_build_params_with_metadata`` (the
  ``keys_to_select`` filter, first-match ``lr_multipliers``, the 1-D weight-decay rule) and
  ``_build_optimizer_internal`` (one param group per distinct ``(lr, weight_decay)``).
* ``cosmos_framework/utils/functional/lr_scheduler.py`` — ``LambdaLinearScheduler``.
* ``cosmos_framework/callbacks/grad_clip.py`` — one global norm over every mesh group,
  ``force_finite`` zeroing of NaN/Inf grads.
* ``cosmos_framework/configs/base/experiment/action/posttrain_config/action_policy_libero_all_nano.py``
  — the LIBERO recipe: AdamW-style, lr 5e-5, betas (0.9, 0.99), eps 1e-8, weight decay 0.05,
  ``keys_to_select`` = the generation + action heads, 5x LR on the action heads,
  LambdaLinear with ``f_start=1e-6, f_max=1, f_min=0``, grad clip 1.0.

Everything here is model-agnostic: it works on any ``nn.Module``, plain or FSDP2-sharded
(DTensor parameters), and matches parameter names after removing wrapper prefixes.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

logger = logging.getLogger(__name__)

# Module-name segments that wrappers insert into parameter names: FSDP1, activation
# checkpointing (``checkpoint_wrapper``) and ``torch.compile``. FSDP2 (``fully_shard``) inserts
# none, but a model may be wrapped by the others. torch.distributed.checkpoint strips the same
# segments, so cleaned names equal the keys of ``get_model_state_dict``.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def clean_param_name(name: str) -> str:
    """Return ``name`` without wrapper segments, so patterns match the model's own names."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


def named_parameters_clean(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``model.named_parameters()`` with wrapper segments removed from each name."""
    return [(clean_param_name(name), param) for name, param in model.named_parameters()]


class TrainableSelection(NamedTuple):
    """Parameter element counts (global, not per shard) after :func:`select_trainable`."""

    n_trainable: int
    n_frozen: int


def select_trainable(model: nn.Module, keys_to_select: Sequence[str] | None) -> TrainableSelection:
    """Freeze every parameter whose name contains none of ``keys_to_select``.

    As in cosmos-framework's ``_build_params_with_metadata``: ``None`` or an empty list keeps the
    current ``requires_grad`` flags (train everything trainable); otherwise a parameter stays
    trainable iff its (cleaned) name contains at least one entry as a substring. Selection only
    narrows: an already frozen parameter is never unfrozen. Unlike cosmos-framework, an entry
    that matches no parameter name at all is an error (a typo would otherwise silently train
    nothing of that module).
    """
    params = named_parameters_clean(model)
    if keys_to_select:
        unmatched = [key for key in keys_to_select if not any(key in name for name, _ in params)]
        if unmatched:
            examples = ", ".join(name for name, _ in params[:5])
            raise ValueError(
                f"keys_to_select entries {unmatched} match no parameter of {type(model).__name__} "
                f"(names look like: {examples}, ...)"
            )
        for name, param in params:
            if not any(key in name for key in keys_to_select):
                param.requires_grad_(False)
    n_trainable = sum(p.numel() for _, p in params if p.requires_grad)
    n_frozen = sum(p.numel() for _, p in params if not p.requires_grad)
    logger.info(
        "trainable parameters: %d elements (%d tensors); frozen: %d elements",
        n_trainable,
        sum(1 for _, p in params if p.requires_grad),
        n_frozen,
    )
    return TrainableSelection(n_trainable, n_frozen)


def _lr_multiplier(name: str, lr_multipliers: Mapping[str, float]) -> float:
    """First pattern (in mapping order) contained in ``name`` wins — cosmos-framework's rule."""
    for pattern, mult in lr_multipliers.items():
        if pattern in name:
            return float(mult)
    return 1.0


def build_param_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    lr_multipliers: Mapping[str, float] | None = None,
    *,
    disable_weight_decay_for_1d_params: bool = False,
) -> list[dict[str, Any]]:
    """Group the trainable parameters by effective ``(lr, weight_decay)``.

    * LR: ``lr x mult`` where ``mult`` belongs to the **first** ``lr_multipliers`` key (in
      insertion order) that is a substring of the cleaned parameter name, else 1.0. Put more
      specific patterns first when two can match the same name.
    * Weight decay: applied to every parameter (cosmos-framework's default
      ``disable_weight_decay_for_1d_params=False``); when that flag is set, tensors with fewer
      than two dims (norm weights, biases) get ``weight_decay=0``.
    * Groups are sorted by ``(lr, decay enabled)`` like cosmos-framework, so the group order is
      deterministic (optimizer state dicts depend on it).

    A multiplier key that matches no parameter name is an error (typo guard).
    """
    lr_multipliers = dict(lr_multipliers or {})
    params = named_parameters_clean(model)
    unmatched = [key for key in lr_multipliers if not any(key in name for name, _ in params)]
    if unmatched:
        raise ValueError(f"lr_multipliers keys {unmatched} match no parameter of {type(model).__name__}")

    buckets: dict[tuple[float, bool], list[nn.Parameter]] = defaultdict(list)
    for name, param in params:
        if not param.requires_grad:
            continue
        decay = not (disable_weight_decay_for_1d_params and param.dim() < 2)
        buckets[(lr * _lr_multiplier(name, lr_multipliers), decay)].append(param)
    if not buckets:
        raise ValueError(f"{type(model).__name__} has no trainable parameters to optimize")

    groups = []
    for (group_lr, decay), group_params in sorted(buckets.items()):
        groups.append(
            {"params": group_params, "lr": group_lr, "weight_decay": weight_decay if decay else 0.0}
        )
        logger.info(
            "param group lr=%g weight_decay=%g: %d tensors, %d elements",
            group_lr,
            groups[-1]["weight_decay"],
            len(group_params),
            sum(p.numel() for p in group_params),
        )
    return groups


def _on_cuda(params: Iterable[torch.Tensor]) -> bool:
    return all(p.device.type == "cuda" for p in params)


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.99),
    eps: float = 1e-8,
    lr_multipliers: Mapping[str, float] | None = None,
    *,
    disable_weight_decay_for_1d_params: bool = False,
    implementation: str | None = None,
) -> torch.optim.AdamW:
    """AdamW over :func:`build_param_groups` (call :func:`select_trainable` first).

    cosmos-framework's LIBERO recipe uses its own ``FusedAdam`` with fp32 master weights; here the
    FSDP2 sharded parameters are already the fp32 (or as-trained) master copy, so
    ``torch.optim.AdamW`` is the equivalent. ``implementation`` None: the fused kernel when every
    parameter is on CUDA, ``foreach`` otherwise (fused AdamW has no CPU path worth using); or name
    ``"fused"`` / ``"foreach"`` (benchmarks compare them).
    """
    if implementation not in (None, "fused", "foreach"):
        raise ValueError(f"unknown AdamW implementation {implementation!r}; use 'fused' or 'foreach'")
    groups = build_param_groups(
        model,
        lr,
        weight_decay,
        lr_multipliers,
        disable_weight_decay_for_1d_params=disable_weight_decay_for_1d_params,
    )
    all_params = [p for group in groups for p in group["params"]]
    implementation = implementation or ("fused" if _on_cuda(all_params) else "foreach")
    impl: dict[str, bool] = {implementation: True}
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **impl)


def lambda_linear_factor(
    step: int,
    warmup_steps: int,
    total_steps: int,
    f_start: float = 1e-6,
    f_max: float = 1.0,
    min_lr_rate: float = 0.0,
) -> float:
    """LR multiplier of cosmos-framework's ``LambdaLinearScheduler`` (single cycle) at ``step``.

    * ``step < warmup_steps``: ``f_start + (f_max - f_start) * step / warmup_steps`` — so step 0
      is ``f_start`` and ``f_max`` is first reached at ``step == warmup_steps``.
    * ``warmup_steps <= step <= total_steps``:
      ``min_lr_rate + (f_max - min_lr_rate) * (total_steps - step) / (total_steps - warmup_steps)``
      — ``f_max`` at the end of warm-up, ``min_lr_rate`` (cosmos ``f_min``) at ``total_steps``.
    * ``step > total_steps``: flat at ``min_lr_rate``. (Ours: cosmos-framework's scheduler fails
      with a TypeError past the end of its last cycle; holding the floor lets a run overshoot.)

    ``step`` is the number of optimizer steps already taken: ``LambdaLR`` evaluates step 0 at
    construction and the trainer calls ``scheduler.step()`` after every ``optimizer.step()``, as
    cosmos-framework's trainer does — so the first update uses ``f_start``.
    """
    if step < warmup_steps:
        return f_start + (f_max - f_start) * step / warmup_steps
    step = min(step, total_steps)
    return min_lr_rate + (f_max - min_lr_rate) * (total_steps - step) / (total_steps - warmup_steps)


def lambda_linear_schedule(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    total_steps: int,
    f_start: float = 1e-6,
    f_max: float = 1.0,
    min_lr_rate: float = 0.0,
) -> LambdaLR:
    """``LambdaLR`` driving every param group by :func:`lambda_linear_factor` of its own base LR.

    The multiplier is a plain function of the step (not a callable object), so the scheduler's
    state dict holds only counters and LRs: resuming with a changed ``total_steps`` applies the new
    schedule from the restored step.
    """
    if warmup_steps < 0 or total_steps <= warmup_steps:
        raise ValueError(
            f"LambdaLinear needs 0 <= warmup_steps < total_steps (got warmup_steps={warmup_steps}, "
            f"total_steps={total_steps})"
        )

    def factor(step: int) -> float:
        return lambda_linear_factor(step, warmup_steps, total_steps, f_start, f_max, min_lr_rate)

    return LambdaLR(optimizer, factor)


def _mesh_key(param: torch.Tensor) -> str:
    if isinstance(param, DTensor):
        names = param.device_mesh.mesh_dim_names
        return "-".join(names) if names else f"mesh{id(param.device_mesh)}"
    return "default"


def _global_norm(groups: Mapping[str, list[torch.Tensor]]) -> torch.Tensor:
    """L2 norm over all groups; each DTensor group norm is fully reduced first (cosmos grad_clip)."""
    norms = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0, False, True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        norms.append(norm.float())
    if len(norms) == 1:
        return norms[0]
    return torch.stack([n.to(norms[0].device) for n in norms]).pow(2).sum().sqrt()


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float, *, force_finite: bool = True) -> torch.Tensor:
    """Clip all gradients of ``model`` by one global L2 norm and return that (pre-clip) norm as a 0-d tensor.

    Works on plain and FSDP2 (DTensor) gradients: each mesh group's norm is reduced to a plain
    tensor with ``full_tensor()``, so the norm is identical on every rank. With ``force_finite`` (the
    LIBERO recipe's ``grad_clip.force_finite=True``), a non-finite norm zeroes NaN/Inf gradient entries
    and the norm is measured again, as cosmos-framework does: that check is this function's one host
    sync (none without ``force_finite``); the norm itself stays on the device. A zero tensor when no
    parameter has a gradient.
    """
    groups: dict[str, list[torch.Tensor]] = defaultdict(list)
    for param in model.parameters():
        if param.grad is not None:
            groups[_mesh_key(param)].append(param)
    if not groups:
        return torch.zeros(())
    total = _global_norm(groups)
    if force_finite and not bool(torch.isfinite(total)):
        for params in groups.values():
            for param in params:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        total = _global_norm(groups)
        logger.warning("non-finite gradients were zeroed before clipping (norm after: %s)", float(total))
    for params in groups.values():
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.to(params[0].device), foreach=True)
    return total


def clip_grad_norm(model: nn.Module, max_norm: float, *, force_finite: bool = True) -> float:
    """:func:`clip_grad_norm_` with the norm read back as a float (one more host sync)."""
    value = float(clip_grad_norm_(model, max_norm, force_finite=force_finite))
    if not math.isfinite(value):
        logger.warning("gradient norm is %s", value)
    return value
