"""A round's starts (rl/rounds.round_starts), its GRPO and PPO decisions (rl/rounds.grpo_decisions,
rl/rounds.ppo_decisions) and the driver's bookkeeping of a crashed attempt (runners/rl_rollout.RoundCollector._record),
by hand."""

from __future__ import annotations

import pytest
import torch

from rlinf_cosmos3.rl.rounds import grpo_decisions, ppo_decisions, round_reset_seeds, round_starts
from rlinf_cosmos3.runners.rl_rollout import RoundCollector
from rlinf_cosmos3.workers.env.results import EpisodeResult

STARTS = [(task, init) for task in range(2) for init in range(5)]


def test_each_pass_covers_every_start_once_and_rounds_depend_only_on_seed_and_index() -> None:
    rounds = [round_starts(STARTS, 2, seed=7, round_index=r) for r in range(5)]  # 5 rounds x 2 = one pass of 10
    assert sorted(s for r in rounds for s in r) == STARTS
    assert rounds == [round_starts(STARTS, 2, seed=7, round_index=r) for r in range(5)]  # a resume sees the same
    assert round_starts(STARTS, 2, seed=8, round_index=0) != rounds[0] or \
        round_starts(STARTS, 2, seed=8, round_index=1) != rounds[1]
    spanning = round_starts(STARTS, 4, seed=7, round_index=2)  # starts 8..11: the end of pass 0, the start of pass 1
    assert spanning[:2] == round_starts(STARTS, 2, seed=7, round_index=4)
    assert len(spanning) == 4 and set(spanning) <= set(STARTS)
    with pytest.raises(ValueError):
        round_starts([], 1, 0, 0)


def test_reset_seeds_give_a_group_one_scene_and_depend_only_on_seed_round_and_start() -> None:
    """The simulator reset seed of each start: one per start (a start twice in a round: one seed), the same when the
    round is played again (a resume), another in another round or run, within numpy's 32-bit seed range."""
    starts = round_starts(STARTS, 4, seed=7, round_index=2)  # spans two passes: one start twice
    assert len(set(starts)) == 3
    seeds = round_reset_seeds(starts, seed=7, round_index=2)
    assert seeds == round_reset_seeds(starts, seed=7, round_index=2)
    assert all((a == b) == (seeds[i] == seeds[j]) for i, a in enumerate(starts) for j, b in enumerate(starts))
    assert all(0 <= s < 2**32 for s in seeds)
    assert round_reset_seeds(starts, seed=7, round_index=3) != seeds
    assert round_reset_seeds(starts, seed=8, round_index=2) != seeds
    with pytest.raises(ValueError):
        round_reset_seeds(starts, 7, -1)


def test_grpo_decisions_by_hand() -> None:
    """Group A: success, failure -> +-0.7071 (sample std sqrt(0.5)); group B: both fail -> dropped."""
    out = grpo_decisions([1.0, 0.0, 0.0, 0.0], [("A",), ("A",), ("B",), ("B",)], [[0, 1], [2], [3, 4], [5]], 1e-6)
    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    assert out.decision_ids == [0, 1, 2]
    assert out.advantages == pytest.approx([a, a, -a])
    assert out.episode_keep.tolist() == [True, True, False, False]
    assert torch.allclose(out.episode_advantages, torch.tensor([a, -a, 0.0, 0.0], dtype=torch.float64))
    empty = grpo_decisions([], [], [], 1e-6)
    assert empty.decision_ids == [] and empty.advantages == []


def test_ppo_decisions_by_hand() -> None:
    """Episode A succeeds at its 2nd decision (reward 1 there, terminated: no bootstrap); episode B runs to the cap
    after 3 decisions (truncated: its last decision bootstraps from its own observation's value); C made none."""
    g, lam = 0.99, 0.95
    va, vb = [0.5, 0.8], [0.1, 0.2, 0.4]
    out = ppo_decisions([True, False, False], [[10, 12], [11, 13, 14], []], [va, vb, []], g, lam)
    a1 = 1.0 - va[1]                                   # r + 0 * V' - V
    a0 = (g * va[1] - va[0]) + g * lam * a1
    b2 = g * vb[2] - vb[2]                             # V' = V(last observation)
    b1 = (g * vb[2] - vb[1]) + g * lam * b2
    b0 = (g * vb[1] - vb[0]) + g * lam * b1
    raw = torch.tensor([a0, a1, b0, b1, b2], dtype=torch.float64)
    assert out.decision_ids == [10, 12, 11, 13, 14]
    assert out.returns == pytest.approx([a0 + va[0], a1 + va[1], b0 + vb[0], b1 + vb[1], b2 + vb[2]], abs=1e-12)
    assert out.returns[1] == pytest.approx(1.0)  # the success decision's target is its reward
    normalised = (raw - raw.mean()) / (raw.std(unbiased=False) + 1e-5)  # population std over the round, RLinf's
    assert out.advantages == pytest.approx(normalised.tolist(), abs=1e-12)
    assert out.episode_keep.tolist() == [True, True, True]
    assert out.episode_advantages.tolist() == pytest.approx([normalised[0].item(), normalised[2].item(), 0.0])
    # gamma = lambda = 1 and zero values: the Monte Carlo returns (1 for every decision of A, 0 for B)
    mc = ppo_decisions([True, False], [[0, 1], [2, 3]], [[0.0, 0.0], [0.0, 0.0]], 1.0, 1.0)
    assert mc.returns == [1.0, 1.0, 0.0, 0.0]
    empty = ppo_decisions([], [], [], g, lam)
    assert empty.decision_ids == [] and empty.returns == []


def test_a_truncated_episode_bootstraps_from_the_observation_it_stopped_at() -> None:
    """With the env's last observation valued (``final_values``), a truncated episode's last decision bootstraps
    from that value instead of its own; a terminated episode's final value (None) changes nothing, and a truncated
    one without a final value keeps the old stand-in (its last decision's own V)."""
    g, lam = 0.99, 0.95
    va, vb, vc = [0.5, 0.8], [0.1, 0.2, 0.4], [0.3]
    final_b = 0.7
    out = ppo_decisions([True, False, False], [[10, 12], [11, 13, 14], [15]], [va, vb, vc], g, lam,
                        final_values=[None, final_b, None])
    a1 = 1.0 - va[1]
    a0 = (g * va[1] - va[0]) + g * lam * a1
    b2 = g * final_b - vb[2]                           # V' = V(the observation after the cap's last command)
    b1 = (g * vb[2] - vb[1]) + g * lam * b2
    b0 = (g * vb[1] - vb[0]) + g * lam * b1
    c0 = g * vc[0] - vc[0]                             # no final value: its own V stands in
    assert out.returns == pytest.approx([a0 + va[0], a1 + va[1], b0 + vb[0], b1 + vb[1], b2 + vb[2], c0 + vc[0]],
                                        abs=1e-12)
    same = ppo_decisions([True, False, False], [[10, 12], [11, 13, 14], [15]], [va, vb, vc], g, lam)
    assert same.returns[:2] == out.returns[:2] and same.returns[5] == out.returns[5]
    assert same.returns[4] != pytest.approx(out.returns[4])
    with pytest.raises(ValueError, match="3 outcomes but 2 final values"):
        ppo_decisions([True, False, False], [[10, 12], [11, 13, 14], [15]], [va, vb, vc], g, lam, final_values=[None, 0.1])


@pytest.mark.parametrize(("successes", "decisions", "values", "words"), [
    ([True], [[0, 1]], [[0.1]], "2 decisions but 1 values"),
    ([True, False], [[0]], [[0.1]], "2 outcomes, 1 decision lists"),
])
def test_ppo_decisions_bad_inputs(successes, decisions, values, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ppo_decisions(successes, decisions, values, 0.99, 0.95)


def _result(slot: int, trial: int, attempts: int, error: str | None = None, success: bool = False) -> EpisodeResult:
    return EpisodeResult(suite="libero_spatial", task_id=0, trial_id=trial, success_once=success,
                         success_at_end=success, steps=42, error=error, slot_id=slot, attempts=attempts)


def test_a_crashed_attempts_decisions_are_dropped_and_a_failed_episode_left_out() -> None:
    collector = RoundCollector(envs=None, actor=None, stages=1, seed=0, iteration=1, num_episodes=3, progress=False)
    # slot 0: attempt 1 made decisions 0, 1, then crashed; attempt 2 made 4, 5. slot 1: one clean attempt.
    # slot 2: crashed on every attempt.
    collector._pending[0] += [(1, 0), (1, 1), (2, 4), (2, 5)]
    collector._pending[1] += [(1, 2), (1, 3)]
    collector._pending[2] += [(1, 6), (2, 7)]
    collector._record([_result(0, 3, attempts=2, success=True), _result(1, 3, attempts=1),
                       _result(2, 4, attempts=2, error="SimProcessError on each of 2 attempt(s)")])
    result = collector.result
    assert [(e.result.slot_id, e.decision_ids) for e in result.episodes] == [(0, [4, 5]), (1, [2, 3])]
    assert [r.slot_id for r in result.failed] == [2]
    assert result.dropped_decisions == 2 + 2  # slot 0's first attempt, and both of slot 2's
    assert not collector._pending
    assert all(e.values == [] for e in result.episodes)  # GRPO: the actor returned no values


def test_ppo_values_follow_the_kept_decisions() -> None:
    """PPO: each kept decision's value (as the actor returned it) goes with its episode, in decision order; the
    values of a crashed attempt's decisions do not."""
    collector = RoundCollector(envs=None, actor=None, stages=1, seed=0, iteration=1, num_episodes=1, progress=False)
    collector._pending[0] += [(1, 0), (2, 1), (2, 2)]
    collector._values.update({0: 0.5, 1: 0.25, 2: -0.125})
    collector._record([_result(0, 3, attempts=2)])
    (episode,) = collector.result.episodes
    assert episode.decision_ids == [1, 2] and episode.values == [0.25, -0.125]


def test_a_truncated_episodes_final_value_goes_with_its_finishing_attempt() -> None:
    """The value of the observation a truncated episode stopped at is kept by (slot, attempt): it goes with the
    episode whose result names that attempt, and an episode that ended in success gets none."""
    collector = RoundCollector(envs=None, actor=None, stages=1, seed=0, iteration=1, num_episodes=2, progress=False)
    collector._pending[0] += [(2, 1)]
    collector._pending[1] += [(1, 2)]
    collector._values.update({1: 0.25, 2: 0.5})
    collector._final_values[(0, 2)] = 0.75
    collector._record([_result(0, 3, attempts=2), _result(1, 4, attempts=1, success=True)])
    truncated, succeeded = collector.result.episodes
    assert (truncated.final_value, succeeded.final_value) == (0.75, None)
    assert not collector._final_values
