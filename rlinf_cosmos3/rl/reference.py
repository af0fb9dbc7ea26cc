"""The reference policy of the KL term (``algorithm.kl_coef > 0``): the weights RL started from, of the trainable
part only, kept on the host and swapped in for the reference's log-probs.

Why this form: the reference is the frozen start policy (GRPO's and RLinf's ``kl_beta`` term pulls toward the SFT
model). Only ``actor.trainable``'s parameters ever move, so only they need a frozen copy: the frozen part is shared
by construction. The copy lives in host memory, so the accelerator holds no second model; once per round the actor
swaps it into the live parameters (the current values saved on the host), computes every kept decision's reference
log-prob of its stored SDE step with the same :func:`~rlinf_cosmos3.rl.action_chain.chain_log_prob`, and swaps back
exactly. Each epoch's KL then needs no extra forward.

The start weights are taken right after the policy is loaded from ``rollout.model.model_path`` and before a resumed
checkpoint overwrites them, so a resumed run keeps the same reference as the straight run. Under FSDP2 the swap
writes each parameter's local shard; every FSDP module is resharded first, so no forward sees a stale unsharded
copy gathered by an earlier forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["ReferenceWeights"]


def _local(param: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's values: a DTensor's local shard, else the parameter itself."""
    return param.to_local() if isinstance(param, DTensor) else param


def _reshard(module: nn.Module) -> None:
    """Drop every FSDP2 module's gathered parameters, so the next forward gathers the (swapped) shards."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()


class ReferenceWeights:
    """A host copy of ``module``'s trainable parameters as they are now (call it on the start weights)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._params = [p for p in module.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("no trainable parameter: the reference would equal the policy")
        self._start = [_local(p).detach().to("cpu", copy=True) for p in self._params]

    @property
    def num_elements(self) -> int:
        return sum(t.numel() for t in self._start)

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """Inside the block the module computes with the start weights (no gradient); afterwards its own weights
        are back, bit for bit."""
        current = [_local(p).detach().to("cpu", copy=True) for p in self._params]
        with torch.no_grad():
            _reshard(self.module)
            for param, start in zip(self._params, self._start, strict=True):
                _local(param).copy_(start)
            try:
                yield
            finally:
                _reshard(self.module)
                for param, saved in zip(self._params, current, strict=True):
                    _local(param).copy_(saved)
