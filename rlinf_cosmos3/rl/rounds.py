"""Which (task, init state) starts a rollout round plays, and how its episodes become GRPO's or PPO's decisions.

Pure functions of the run's seed and the round's index, so a resumed run plays the rounds the straight run would
have played, and the driver and the tests agree on them without any state.

* :func:`round_reset_seeds`: the simulator reset seed of each start of round ``r`` (one scene per group).
* :func:`round_starts`: the starts of round ``r`` are consecutive slices of an endless sequence of shuffles of
  every configured start (one shuffle per pass, seeded by ``(seed, pass)``): each start comes up once per pass,
  in an order no task dominates. A round that spans two passes may hold one start twice: its episodes then form
  one group of ``2G`` (the same start: still a valid GRPO group).
* :func:`grpo_decisions`: the episodes a round kept (a crashed attempt's decisions are already gone) -> each
  decision's GRPO advantage, groups without signal dropped (:func:`~rlinf_cosmos3.rl.advantages.grpo_advantages`).
* :func:`ppo_decisions`: the same episodes with the value of each decision's observation -> every decision's GAE
  advantage (normalised over the round) and return (the value head's target), from per-decision rewards: 1 at
  the decision whose chunk reached success, which terminates the episode; 0 elsewhere. An episode that ran to the
  suite's cap is truncated, not terminated: its last decision bootstraps from the value of the observation the
  episode stopped at (the env hands it out with the result; without it, the last decision's own observation).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rlinf_cosmos3.rl.advantages import grpo_advantages
from rlinf_cosmos3.rl.gae import compute_gae, next_values_of, normalize_advantages

__all__ = ["RoundDecisions", "grpo_decisions", "ppo_decisions", "round_reset_seeds", "round_starts"]


def round_reset_seeds(starts: Sequence[tuple[int, int]], seed: int, round_index: int) -> list[int]:
    """The simulator reset seed of each start (``(task, init state)``) of round ``round_index``: every episode of a
    start's group begins in the same scene (the furniture LIBERO places at each reset included; a start that comes
    up twice in a round gets one seed), and a resumed run's rounds begin in the scenes the straight run's did,
    whatever its simulators ran before."""
    if round_index < 0:
        raise ValueError(f"need round_index >= 0, got {round_index}")
    return [int(np.random.SeedSequence([seed, round_index, task, init]).generate_state(1)[0]) for task, init in starts]


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
    """``[N]`` GRPO: every episode's advantage (0 where dropped); PPO: its first decision's (normalised)."""
    episode_keep: torch.Tensor
    """``[N]`` bool: the episode's group has signal (PPO: every episode is kept)."""
    returns: list[float] = field(default_factory=list)
    """PPO: each kept decision's GAE return ``A + V`` (before the advantages' normalisation), the value head's
    target; empty for GRPO."""


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


def ppo_decisions(successes: Sequence[bool], decisions: Sequence[Sequence[int]], values: Sequence[Sequence[float]],
                  gamma: float, gae_lambda: float,
                  final_values: Sequence[float | None] | None = None) -> RoundDecisions:
    """PPO over a round's episodes: ``successes[i]`` (the episode ended at its first success), ``decisions[i]``
    (its decision ids, in order) and ``values[i]`` (the value head's ``V`` of each decision's observation, at
    rollout); ``final_values[i]``: ``V`` of the observation a truncated episode stopped at (None, or no list: its
    last decision's own ``V`` stands in). Every decision is kept; see the module docstring for rewards,
    termination and truncation."""
    if not len(successes) == len(decisions) == len(values):
        raise ValueError(f"{len(successes)} outcomes, {len(decisions)} decision lists, {len(values)} value lists")
    if final_values is not None and len(final_values) != len(successes):
        raise ValueError(f"{len(successes)} outcomes but {len(final_values)} final values")
    for episode, (ids, vals) in enumerate(zip(decisions, values, strict=True)):
        if len(ids) != len(vals):
            raise ValueError(f"episode {episode}: {len(ids)} decisions but {len(vals)} values")
    count, horizon = len(decisions), max((len(ids) for ids in decisions), default=0)
    if horizon == 0:
        empty = torch.zeros(count, dtype=torch.float64)
        return RoundDecisions([], [], empty, torch.ones(count, dtype=torch.bool), [])
    shape = (horizon, count)
    v = torch.zeros(shape, dtype=torch.float64)
    rewards, valid = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.bool)
    terminated, truncated = torch.zeros(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.bool)
    bootstrap = torch.zeros(shape, dtype=torch.float64)
    for episode, (vals, success) in enumerate(zip(values, successes, strict=True)):
        length = len(vals)
        if length == 0:
            continue
        v[:length, episode] = torch.tensor([float(x) for x in vals], dtype=torch.float64)
        valid[:length, episode] = True
        last = length - 1
        rewards[last, episode] = 1.0 if success else 0.0
        (terminated if success else truncated)[last, episode] = True
        final = None if final_values is None else final_values[episode]
        bootstrap[last, episode] = v[last, episode] if final is None else float(final)
    # a truncated episode's V' is the value of the observation it stopped at (else its last decision's own V)
    next_v = next_values_of(v, torch.zeros(count, dtype=torch.float64), truncated, final_values=bootstrap)
    advantages, returns = compute_gae(rewards, v, next_v, terminated, truncated, gamma, gae_lambda)
    normalised = normalize_advantages(advantages, valid)
    ids, adv, ret = [], [], []
    for episode, episode_ids in enumerate(decisions):
        ids += [int(d) for d in episode_ids]
        adv += normalised[:len(episode_ids), episode].tolist()
        ret += returns[:len(episode_ids), episode].tolist()
    first = torch.where(valid[0], normalised[0], torch.zeros_like(normalised[0]))
    return RoundDecisions(ids, adv, first, torch.ones(count, dtype=torch.bool), ret)
