"""Generalised advantage estimation (GAE) over per-decision rewards, for PPO with a value head.

A decision is one policy call (one action chunk, of which the env runs ``executed_steps`` commands); the
discount applies per decision, as RLinf's chunk-level rewards do. Tensors are time-major ``[T, B]``: ``T``
decisions of ``B`` envs. With ``V`` the value head and ``V'`` the value of the observation that follows
decision ``t`` (``next_values``):

    delta_t = r_t + gamma * (1 - terminated_t) * V'_t - V_t
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},     done_t = terminated_t or truncated_t
    return_t = A_t + V_t                                             (the value head's target)

**Termination vs truncation.** Both end the episode, so neither lets ``A`` flow back from the next row (a
new episode after an auto-reset, or padding). They differ in the bootstrap:

* **terminated** (success: the episode stops there): the future is over, ``V'`` counts 0;
* **truncated** (the suite's step cap): the task was not over, only our budget was, so the return is
  bootstrapped with ``V'`` = the value of the observation the episode stopped at. Treating the cap as a
  termination (RLinf's ``dones``) would teach the value head that a slow episode's last states are worth 0
  although success was still reachable from them.

The last row of a rollout window that did not end bootstraps in the same way: its ``V'`` is the value of
the observation after it (``last_values`` in :func:`next_values_of`), and ``A_{T} = 0``.
"""

from __future__ import annotations

import torch

__all__ = ["compute_gae", "next_values_of", "normalize_advantages"]


def next_values_of(values: torch.Tensor, last_values: torch.Tensor, truncated: torch.Tensor | None = None,
                   final_values: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, B]`` ``V'``: ``values`` shifted up by one decision, ``last_values`` ``[B]`` (the observation after
    the window's last decision) in the last row, and ``final_values`` ``[T, B]`` (the value of the observation
    an episode was truncated at) where ``truncated``. After a termination ``V'`` is unused."""
    shifted = torch.cat([values[1:], last_values.reshape(1, -1).to(values.dtype)], dim=0)
    if truncated is None:
        return shifted
    if final_values is None:
        raise ValueError("truncated episodes bootstrap from final_values: pass the value of the observation "
                         "each one stopped at")
    return torch.where(truncated.bool(), final_values.to(values.dtype), shifted)


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
                truncated: torch.Tensor, gamma: float = 0.99, gae_lambda: float = 0.95
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both ``[T, B]``, from ``rewards``, ``values`` (``V`` of each decision's own
    observation), ``next_values`` (``V'``, :func:`next_values_of`) and the bool ``terminated`` /
    ``truncated`` flags of the step that ends the episode, all ``[T, B]``. Rows after an episode's end that
    hold no decision must be masked out of the losses by the caller."""
    shapes = {tuple(x.shape) for x in (rewards, values, next_values, terminated, truncated)}
    if len(shapes) != 1 or rewards.ndim != 2:
        raise ValueError(f"rewards, values, next_values, terminated, truncated must share one [T, B] shape, got {shapes}")
    terminated, truncated = terminated.bool(), truncated.bool()
    alive = (~terminated).to(values.dtype)
    carries = (~(terminated | truncated)).to(values.dtype)
    deltas = rewards.to(values.dtype) + gamma * alive * next_values - values
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * gae_lambda * carries[t] * running
        advantages[t] = running
    return advantages, advantages + values


def normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-5
                         ) -> torch.Tensor:
    """``(A - mean) / (std + eps)`` over the batch's counted decisions (PPO's usual batch normalisation; RLinf
    uses the population std and ``eps = 1e-5``). Entries outside ``mask`` come back as 0."""
    weights = torch.ones_like(advantages) if mask is None else mask.to(advantages.dtype)
    count = weights.sum().clamp(min=1.0)
    mean = (advantages * weights).sum() / count
    var = (((advantages - mean) ** 2) * weights).sum() / count
    return (advantages - mean) / (var.sqrt() + eps) * weights
