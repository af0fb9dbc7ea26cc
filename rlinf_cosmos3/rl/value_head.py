"""The value head for PPO: a small MLP on a pooled feature vector of the policy, and its clipped value loss.

Why this shape (RLinf's pi0/pi0.5 pattern, ``rlinf/models/embodiment/modules/value_head.py``): an MLP with
ReLU hidden layers (512, 256, 128) and a biased scalar output on the mean of some of the transformer's
token features. Which tokens are pooled is the trainer's choice; they must see the observation (a prompt-only
feature cannot tell states apart). The input is detached by default (RLinf's ``detach_critic_input: True``
in its LIBERO PPO recipes): the value loss then trains the head only, and what the transformer learns is
decided by the policy loss and ``actor.trainable`` alone. The last layer starts near 0 (std 0.02, bias 0), so
the first advantages are close to the GAE of the rewards rather than of random values.

The value loss is PPO's clipped form with a Huber error (RLinf's ``compute_ppo_critic_loss``):

    V_clip = V_old + clip(V - V_old, -c, c)
    loss   = masked mean of max(huber(R - V), huber(R - V_clip))        (c = 0.2, huber delta 10)

With 0/1 rewards and delta 10 the Huber is the squared error / 2. The clip keeps the head from moving far
from the values the advantages were computed with in one iteration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from rlinf_cosmos3.rl.ppo_loss import masked_mean

__all__ = ["ValueHead", "ValueLoss", "clipped_value_loss", "huber", "masked_mean_pool"]


class ValueHead(nn.Module):
    """``[..., input_dim]`` -> ``[...]`` state values."""

    def __init__(self, input_dim: int, hidden_sizes: Sequence[int] = (512, 256, 128), *,
                 detach_input: bool = True) -> None:
        super().__init__()
        if input_dim < 1 or any(h < 1 for h in hidden_sizes):
            raise ValueError(f"input_dim and hidden_sizes must be >= 1, got {input_dim}, {list(hidden_sizes)}")
        layers: list[nn.Module] = []
        width = input_dim
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        last = nn.Linear(width, 1)
        nn.init.normal_(last.weight, std=0.02)
        nn.init.zeros_(last.bias)
        self.mlp = nn.Sequential(*layers, last)
        self.detach_input = detach_input

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.detach_input:
            features = features.detach()
        return self.mlp(features.to(self.mlp[-1].weight.dtype)).squeeze(-1)


def masked_mean_pool(hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, L, D]`` token features -> ``[B, D]``: the mean over each row's ``mask`` ``[B, L]`` tokens."""
    if mask is None:
        return hidden.mean(dim=1)
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def huber(error: torch.Tensor, delta: float) -> torch.Tensor:
    """``0.5 e^2`` for ``|e| < delta``, else ``delta (|e| - delta / 2)`` (linear: outliers do not dominate)."""
    abs_error = error.abs()
    return torch.where(abs_error < delta, 0.5 * error * error, delta * (abs_error - 0.5 * delta))


class ValueLoss(NamedTuple):
    loss: torch.Tensor
    """0-D, differentiable."""
    metrics: dict[str, torch.Tensor]
    """Detached 0-D tensors: ``value_loss``, ``value_clip_fraction``, ``explained_variance`` (NaN when the
    returns do not vary)."""


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor | None = None, *, value_clip: float = 0.2,
                       huber_delta: float = 10.0) -> ValueLoss:
    """PPO's clipped value loss of ``values`` (differentiable) against ``returns`` (GAE targets), clipped
    around ``old_values`` (the rollout's); all one shape, ``mask`` bool. Metrics need no host sync."""
    if value_clip <= 0 or huber_delta <= 0:
        raise ValueError(f"value_clip and huber_delta must be > 0, got {value_clip}, {huber_delta}")
    returns, old_values = returns.detach().to(values.dtype), old_values.detach().to(values.dtype)
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    per_decision = torch.maximum(huber(returns - values, huber_delta), huber(returns - clipped, huber_delta))
    loss = masked_mean(per_decision, mask)
    with torch.no_grad():
        v = values.detach()
        counted = torch.ones_like(v, dtype=torch.bool) if mask is None else mask.bool()
        clip_fraction = masked_mean(((v - old_values).abs() > value_clip).to(v.dtype), counted)
        ret_mean = masked_mean(returns, counted)
        var_returns = masked_mean((returns - ret_mean) ** 2, counted)
        residual = returns - v
        var_residual = masked_mean((residual - masked_mean(residual, counted)) ** 2, counted)
        explained = torch.where(var_returns > 0, 1.0 - var_residual / var_returns.clamp(min=1e-12),
                                torch.full_like(var_returns, float("nan")))
    return ValueLoss(loss, {"value_loss": loss.detach(), "value_clip_fraction": clip_fraction,
                            "explained_variance": explained})
