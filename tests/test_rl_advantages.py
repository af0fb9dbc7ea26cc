"""GRPO group advantages (rlinf_cosmos3.rl.advantages) on hand-computed groups.

Each expected number is worked out in the comments: the group mean, the sample std (n - 1), the ratio.
The population std would give other numbers (e.g. +-1.0 instead of +-0.866 for [1, 0, 0, 1]), so the tests
pin the choice.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlinf_cosmos3.rl.advantages import broadcast_to_decisions, episode_returns, grpo_advantages


def test_hand_computed_groups_with_sample_std_and_dropped_groups() -> None:
    # group 7: [1, 0, 0, 1]  mean 0.5, sample var = 4 * 0.25 / 3 = 1/3, std 0.57735 -> A = +-0.5 / 0.57735 = +-0.86603
    # group 3: [1, 0, 0, 0]  mean 0.25, sample var = (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5 -> A = 1.5, -0.5
    # group 5: all succeed, group 9: all fail -> dropped, A = 0
    # group 4: [1, 0, 0] (one episode missing)  mean 1/3, sample var = (4/9 + 1/9 + 1/9) / 2 = 1/3 -> 1.1547, -0.57735
    returns = torch.tensor([1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0], dtype=torch.float32)
    groups = torch.tensor([7, 3, 7, 3, 7, 7, 3, 3, 5, 5, 5, 5, 9, 9, 9, 9, 4, 4, 4])
    adv, keep = grpo_advantages(returns, groups)
    s = 1 / math.sqrt(3)
    expected = [0.5 / s, 1.5, -0.5 / s, -0.5, -0.5 / s, 0.5 / s, -0.5, -0.5, 0, 0, 0, 0, 0, 0, 0, 0,
                (2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s]
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-5, rtol=0)
    assert keep.tolist() == [True] * 8 + [False] * 8 + [True] * 3
    # a kept group's advantages sum to 0 (centred)
    for g in (7, 3, 4):
        assert abs(float(adv[groups == g].sum())) < 1e-5


def test_eps_is_added_to_the_std() -> None:
    # [2, 0]: mean 1, sample std sqrt(2) -> A = 1 / (sqrt(2) + eps); a large eps shows it is in the denominator
    adv, _ = grpo_advantages(torch.tensor([2.0, 0.0]), torch.tensor([0, 0]), eps=1.0)
    torch.testing.assert_close(adv, torch.tensor([1 / (math.sqrt(2) + 1), -1 / (math.sqrt(2) + 1)]))


def test_a_group_of_one_is_dropped() -> None:
    adv, keep = grpo_advantages(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 1, 1]))
    assert keep.tolist() == [False, True, True]
    assert adv[0] == 0


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.zeros(4), torch.zeros(3, dtype=torch.long))


def test_episode_return_and_broadcast_to_its_decisions() -> None:
    # episode 0: 3 decisions, success at the last; episode 1: 2 decisions, no success; episode 2: 1 decision, success
    decision_episode = torch.tensor([0, 0, 0, 1, 1, 2])
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    returns = episode_returns(rewards, decision_episode, 3)
    assert returns.tolist() == [1.0, 0.0, 1.0]
    adv, keep = grpo_advantages(returns, torch.tensor([0, 0, 0]))
    # mean 2/3, sample var = (1/9 + 4/9 + 1/9) / 2 = 1/3 -> A = (1/3) / 0.57735 = 0.57735, -1.1547
    per_decision = broadcast_to_decisions(adv, decision_episode)
    a, b = 1 / math.sqrt(3), -2 / math.sqrt(3)
    torch.testing.assert_close(per_decision, torch.tensor([a, a, a, b, b, a]), atol=1e-5, rtol=0)
    assert broadcast_to_decisions(keep, decision_episode).all()
