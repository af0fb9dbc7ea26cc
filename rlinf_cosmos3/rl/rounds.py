"""Which (task, init state) starts a rollout round plays, and how its episodes become GRPO's decisions.

Pure functions of the run's seed and the round's index, so a resumed run plays the rounds the straight run would
have played, and the driver and the tests agree on them without any state.

* :func:`round_starts`: the starts of round ``r`` are consecutive slices of an endless sequence of shuffles of
  every configured start (one shuffle per pass, seeded by ``(seed, pass)``): each start comes up once per pass,
  in an order no task dominates. A round that spans two passes may hold one start twice: its episodes then form
  one group of ``2G`` (the same start: still a valid GRPO group).
* :func:`grpo_decisions`: the episodes a round kept (a crashed attempt's decisions are already gone) -> each
  decision's GRPO advantage, groups without signal dropped (:func:`~rlinf_cosmos3.rl.advantages.grpo_advantages`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rlinf_cosmos3.rl.advantages import grpo_advantages

__all__ = ["RoundDecisions", "grpo_decisions", "round_starts"]


def round_starts(starts: Sequence[tuple[int, int]], groups: int, seed: int, round_index: int) -> list[tuple[int, int]]:
    """The ``groups`` starts (``(task, init state)``) of round ``round_index`` (0-based); see the module docstring."""
    if not starts:
        raise ValueError("no starts to sample from")
    if groups < 1 or round_index < 0:
        raise ValueError(f"need groups >= 1 and round_index >= 0, got {groups}, {round_index}")
    n = len(starts)
    first, last = round_index * groups, (round_index + 1) * groups
    out: list[tuple[int, int]] = []
    for pass_index in range(first // n, (last - 1) // n + 1):
        order = np.random.default_rng(np.random.SeedSequence([int(seed), pass_index])).permutation(n)
        lo, hi = max(first, pass_index * n), min(last, (pass_index + 1) * n)
        out += [tuple(int(v) for v in starts[int(order[i - pass_index * n])]) for i in range(lo, hi)]
    return out


@dataclass
class RoundDecisions:
    """What a round's update trains on."""

    decision_ids: list[int]
    """The kept decisions (every decision of an episode whose group has signal), in episode order."""
    advantages: list[float]
    """Each kept decision's advantage: its episode's."""
    episode_advantages: torch.Tensor
    """``[N]`` every episode's advantage (0 where dropped)."""
    episode_keep: torch.Tensor
    """``[N]`` bool: the episode's group has signal."""


def grpo_decisions(returns: Sequence[float], groups: Sequence[Hashable], decisions: Sequence[Sequence[int]],
                   eps: float) -> RoundDecisions:
    """GRPO over a round's episodes: ``returns[i]`` (the sparse success reward's sum: 1 or 0), ``groups[i]`` (any
    hashable: the episode's start) and ``decisions[i]`` (its decision ids, in order)."""
    if not len(returns) == len(groups) == len(decisions):
        raise ValueError(f"{len(returns)} returns, {len(groups)} groups, {len(decisions)} decision lists")
    if not returns:
        empty = torch.zeros(0)
        return RoundDecisions([], [], empty, empty.bool())
    index = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    result = grpo_advantages(torch.tensor([float(r) for r in returns], dtype=torch.float64),
                             torch.tensor([index[g] for g in groups]), eps=eps)
    ids: list[int] = []
    advantages: list[float] = []
    for episode, keep in enumerate(result.keep.tolist()):
        if keep:
            ids += [int(d) for d in decisions[episode]]
            advantages += [float(result.advantages[episode])] * len(decisions[episode])
    return RoundDecisions(ids, advantages, result.advantages, result.keep)
