"""Power-function EMA of the trainable weights, as cosmos-framework's "power" EMA.

Sources (cosmos-framework): ``configs/base/defaults/ema.py`` (``PowerEMAConfig``: enabled,
``rate=0.10``, ``iteration_shift=0``), ``model/generator/omni_mot_model.py`` (``set_up_model``:
``ema_exp_coefficient = max real root of [1, 7, 16 - s^-2, 12 - s^-2]``; ``ema_beta``;
``on_before_zero_grad`` updates after every optimizer step), ``utils/generator/dtensor_helper.py``
(``DTensorFastEmaModelUpdater``: ``ema = ema * beta + param * (1 - beta)`` on local shards) and
``utils/ema.py`` (``PowerEMATracker``). The exponent is EDM2's (Karras et al. 2024) power-function
EMA with relative standard deviation ``rate``; ``beta = (1 - 1/(i + 1)) ** (exp + 1)``.

Choices of ours: the shadow covers only the trainable parameters (cosmos-framework keeps a whole
fp32 copy of the network; frozen parameters never change, so their EMA equals themselves and is
taken from the model at export), and it is kept as plain fp32 tensors holding each rank's local
shard — no all-gather per step; only :meth:`PowerEMA.full_state_dict` gathers.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from rlinf_cosmos3.components.optim import named_parameters_clean

logger = logging.getLogger(__name__)


def power_ema_exponent(rate: float) -> float:
    """EDM2 exponent ``gamma`` for relative std ``rate`` (cosmos-framework's ``ema_exp_coefficient``)."""
    return float(np.roots([1, 7, 16 - rate**-2, 12 - rate**-2]).real.max())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _is_rank0() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


class PowerEMA:
    """fp32 power-function EMA of a model's trainable parameters.

    Build it after :func:`~rlinf_cosmos3.components.optim.select_trainable` (and after FSDP2
    sharding, so the shadow holds local shards). Call :meth:`update` after every optimizer step.
    With ``enabled=False`` it holds no tensors and every method is a no-op (``full_state_dict``
    raises, since there is nothing to export).
    """

    def __init__(
        self, model: nn.Module, rate: float = 0.1, iteration_shift: int = 0, enabled: bool = True
    ) -> None:
        if enabled and not 0.0 < rate < 1.0:
            raise ValueError(f"EMA rate must be in (0, 1), got {rate}")
        self.model = model
        self.rate = rate
        self.iteration_shift = iteration_shift
        self.enabled = enabled
        self.exponent = power_ema_exponent(rate) if enabled else 0.0
        self._params: dict[str, nn.Parameter] = {}
        self.shadow: dict[str, torch.Tensor] = {}
        if not enabled:
            return
        with torch.no_grad():
            for name, param in named_parameters_clean(model):
                if param.requires_grad:
                    self._params[name] = param
                    # cosmos-framework copies the regular weights into net_ema at set-up.
                    self.shadow[name] = _local(param).detach().to(torch.float32, copy=True)
        local_bytes = sum(t.numel() * t.element_size() for t in self.shadow.values())
        logger.info(
            "power EMA rate=%g (exponent %.4f): %d tensors, %.1f MiB fp32 on this rank",
            rate,
            self.exponent,
            len(self.shadow),
            local_bytes / 2**20,
        )

    def beta(self, global_step: int) -> float:
        """Decay for the update after optimizer step ``global_step`` (1 = the first step).

        cosmos-framework's trainer passes the 0-based ``iteration`` (optimizer steps done before
        this one) to ``ema_beta``; that is ``global_step - 1`` here. The first update copies the
        weights (beta 0).
        """
        iteration = global_step - 1 + self.iteration_shift
        if iteration < 1:
            return 0.0
        return (1.0 - 1.0 / (iteration + 1)) ** (self.exponent + 1.0)

    @torch.no_grad()
    def update(self, global_step: int) -> None:
        """``shadow = shadow * beta + param * (1 - beta)`` on local shards, after optimizer step ``global_step``."""
        if not self.enabled:
            return
        if global_step < 1:
            raise ValueError(
                f"EMA update needs the number of optimizer steps taken (>= 1), got {global_step}"
            )
        beta = self.beta(global_step)
        # Under no_grad the parameters (local shards) are read as they are: no detach per tensor.
        sources = [_local(p) for p in self._params.values()]
        sources = [s if s.dtype == torch.float32 else s.float() for s in sources]
        # One fused pass: shadow + (1 - beta) * (param - shadow); at beta 0 lerp returns the param exactly.
        torch._foreach_lerp_(list(self.shadow.values()), sources, 1.0 - beta)

    def _as_distributed(self, name: str) -> torch.Tensor:
        """The shadow of ``name`` as a DTensor laid out like its parameter (or the plain tensor)."""
        param = self._params[name]
        if not isinstance(param, DTensor):
            return self.shadow[name]
        return DTensor.from_local(
            self.shadow[name],
            param.device_mesh,
            param.placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Sharded resume state: ``{param name: fp32 shadow}``, DTensors where the params are.

        The DTensors share storage with the shadow, so torch.distributed.checkpoint can save them
        and load into them in place (resharding if the world size changed).
        """
        return {name: self._as_distributed(name) for name in self.shadow}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the shadow from :meth:`state_dict` output (same names, any sharding of equal layout)."""
        if not self.enabled:
            return
        missing = sorted(set(self.shadow) - set(state))
        unexpected = sorted(set(state) - set(self.shadow))
        if missing or unexpected:
            raise KeyError(
                f"EMA state does not match the trainable parameters: missing {missing}, unexpected {unexpected}"
            )
        for name, target in self.shadow.items():
            source = _local(state[name])
            if source.data_ptr() != target.data_ptr():
                target.copy_(source)

    @torch.no_grad()
    def reset_to_model(self) -> None:
        """Re-copy the current weights into the shadow (EMA warm start, e.g. resuming without EMA state)."""
        for name, param in self._params.items():
            self.shadow[name].copy_(_local(param))

    @torch.no_grad()
    def full_state_dict(
        self, model_full_state: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Consolidated fp32 EMA weights on CPU, keyed like the model's full state dict.

        Collective: every rank must call it. Returns the dict on rank 0 and ``{}`` elsewhere.
        Trainable parameters come from the shadow; frozen parameters and buffers from the model
        (cast to fp32 when floating, as cosmos-framework's all-fp32 ``net_ema``). Pass the rank-0
        result of ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` as
        ``model_full_state`` to avoid gathering the model a second time.
        """
        if not self.enabled:
            raise RuntimeError("EMA is disabled; there are no EMA weights to export")
        if model_full_state is None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_full_state = get_model_state_dict(self.model, options=options)
        gathered: dict[str, torch.Tensor] = {}
        for name in self.shadow:
            tensor = self._as_distributed(name)
            full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if _is_rank0():
                gathered[name] = full.detach().to("cpu", copy=True)
        if not _is_rank0():
            return {}
        unknown = sorted(set(gathered) - set(model_full_state))
        if unknown:
            raise KeyError(f"EMA names {unknown[:5]} are not keys of the model state dict")
        result: dict[str, Any] = {}
        for key, value in model_full_state.items():
            if key in gathered:
                result[key] = gathered[key]
            elif torch.is_tensor(value) and value.is_floating_point():
                result[key] = value.detach().to("cpu", torch.float32, copy=True)
            else:
                result[key] = value
        return result
