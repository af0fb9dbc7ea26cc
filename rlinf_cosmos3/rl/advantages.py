"""GRPO advantages: each episode's return against the other episodes of its group, and groups without signal
dropped.

Why: GRPO needs no critic. The G rollouts that start from the same (task, init state) form a group, and an
episode's advantage is how much better it did than its group:

    A_i = (R_i - mean_g(R)) / (std_g(R) + eps)

``std_g`` is the **sample** standard deviation (Bessel's ``n - 1``), as RLinf's registered ``grpo`` advantage
computes it (``grouped_rewards.std(dim=-1)``, ``eps = 1e-6`` added to the std, ``rlinf/algorithms/
advantages.py``). A group whose returns are all equal (all succeed or all fail, with LIBERO's 0/1 success) has
no signal: every ``A_i`` would be 0, and its decisions would only dilute the minibatch mean. Such groups are
dropped through the keep mask (RLinf's ``filter_rewards`` with bounds 0.1/0.9 drops the same groups for
G = 8); so is a group of one, whose std is undefined. Equality is exact (``max == min``): sparse success
rewards are exact numbers.

An episode's advantage applies to every decision it made (:func:`broadcast_to_decisions`): the reward is
the episode's outcome, so each of its decisions is credited with it alike.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["GroupAdvantages", "broadcast_to_decisions", "episode_returns", "grpo_advantages"]


class GroupAdvantages(NamedTuple):
    """Per episode: the normalised advantage (0 where dropped) and whether its group is kept."""

    advantages: torch.Tensor
    """``[N]`` float: ``(R - group mean) / (group sample std + eps)``; 0 for dropped episodes."""
    keep: torch.Tensor
    """``[N]`` bool: False for every episode of a group whose returns are all equal (or of size 1)."""


def grpo_advantages(returns: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> GroupAdvantages:
    """GRPO advantages of ``returns`` ``[N]`` (one per episode) whose groups are ``group_ids`` ``[N]`` (any
    integers; groups may differ in size, e.g. when a crashed env's episode is missing)."""
    if returns.ndim != 1 or returns.shape != group_ids.shape:
        raise ValueError(f"returns {tuple(returns.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    r = returns.to(torch.float64)  # sums of a few 0/1 rewards: exact, and the std without cancellation
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    zeros = torch.zeros(counts.numel(), dtype=r.dtype, device=r.device)
    mean = zeros.index_add(0, inverse, r) / counts
    dev = r - mean[inverse]
    var = zeros.index_add(0, inverse, dev * dev) / (counts - 1).clamp(min=1)
    std = var.sqrt()
    high = zeros.scatter_reduce(0, inverse, r, "amax", include_self=False)
    low = zeros.scatter_reduce(0, inverse, r, "amin", include_self=False)
    varied = (high > low) & (counts >= 2)
    keep = varied[inverse]
    advantages = torch.where(keep, dev / (std[inverse] + eps), torch.zeros_like(dev))
    return GroupAdvantages(advantages.to(returns.dtype if returns.is_floating_point() else torch.float32), keep)


def episode_returns(decision_rewards: torch.Tensor, decision_episode: torch.Tensor, num_episodes: int) -> torch.Tensor:
    """``[num_episodes]``: the undiscounted sum of each episode's per-decision rewards (GRPO's R; with a sparse
    success reward, 1 for an episode that succeeded, else 0). ``decision_episode`` ``[D]``: each decision's
    episode index in ``0..num_episodes-1``."""
    out = torch.zeros(num_episodes, dtype=decision_rewards.dtype, device=decision_rewards.device)
    return out.index_add(0, decision_episode, decision_rewards)


def broadcast_to_decisions(per_episode: torch.Tensor, decision_episode: torch.Tensor) -> torch.Tensor:
    """``[D]``: each decision gets its episode's value (advantage, keep flag): an episode's advantage applies to
    all of its decisions."""
    return per_episode[decision_episode]
