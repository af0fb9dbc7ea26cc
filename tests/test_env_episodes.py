"""Episode listing and assignment to env slots: every (task, init state) exactly once, deterministic."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf_cosmos3.workers.env.episodes import (
    Episode,
    SlotAddress,
    assign_episodes,
    global_slot_id,
    list_episodes,
    slot_address,
    stage_slot_ids,
    worker_plan,
)


def _full_plan(num_tasks: int, trials: int, per_stage: int, workers: int, stages: int):
    episodes = list_episodes(list(range(num_tasks)), trials)
    total = per_stage * workers * stages
    plans = [worker_plan(episodes, total, workers, stages, w) for w in range(workers)]
    return episodes, total, plans


@settings(max_examples=150, deadline=None)
@given(num_tasks=st.integers(1, 12), trials=st.integers(1, 7), per_stage=st.integers(1, 4),
       workers=st.integers(1, 3), stages=st.integers(1, 3))
def test_every_episode_is_assigned_exactly_once(num_tasks: int, trials: int, per_stage: int, workers: int,
                                                stages: int) -> None:
    episodes, total, plans = _full_plan(num_tasks, trials, per_stage, workers, stages)
    slots = [(w, s, i, g, eps) for w, plan in enumerate(plans) for s, stage in enumerate(plan)
             for i, (g, eps) in enumerate(stage)]
    # the layout: E slots, each (worker, stage, position) once, ids 0..E-1
    assert len(slots) == total
    assert sorted(g for *_, g, _ in slots) == list(range(total))
    for w, s, i, g, _ in slots:
        assert slot_address(g, workers, stages) == SlotAddress(w, s, i)
        assert global_slot_id(SlotAddress(w, s, i), workers, stages) == g
    # exactness: the union of all slot queues is the episode list, no duplicates, nothing lost
    assigned = [ep for *_, eps in slots for ep in eps]
    assert Counter(assigned) == Counter(episodes)
    assert len(assigned) == len(set(assigned)) == num_tasks * trials
    # balance: queue lengths differ by at most one; padding slots idle only when episodes run out
    sizes = [len(eps) for *_, eps in slots]
    assert max(sizes) - min(sizes) <= 1
    assert sum(size == 0 for size in sizes) == max(0, total - len(episodes))
    # each queue stays task-major: one env build per task it reaches
    for *_, eps in slots:
        assert eps == sorted(eps)
        assert all(a.task_id <= b.task_id for a, b in zip(eps, eps[1:], strict=False))
    # round-robin: the k-th episodes of the slots 0..E-1 are episodes kE..kE+E-1, in slot order
    queues = {g: eps for *_, g, eps in slots}
    for k in range(max(sizes)):
        assert [queues[g][k] for g in range(total) if len(queues[g]) > k] == episodes[k * total:(k + 1) * total]


@settings(max_examples=50, deadline=None)
@given(num_tasks=st.integers(1, 6), trials=st.integers(1, 5), per_stage=st.integers(1, 3),
       workers=st.integers(1, 3), stages=st.integers(1, 3))
def test_assignment_is_deterministic(num_tasks: int, trials: int, per_stage: int, workers: int, stages: int) -> None:
    assert _full_plan(num_tasks, trials, per_stage, workers, stages) == \
        _full_plan(num_tasks, trials, per_stage, workers, stages)


def test_padding_spreads_the_busy_slots_over_workers_and_stages() -> None:
    """3 episodes on E=8 (W=2, S=2, 2 envs per stage): slots 0,1,2 run one episode each and they sit
    on different (worker, stage) groups; the other 5 slots idle."""
    episodes = list_episodes([4], 3)
    assert episodes == [Episode(4, 0), Episode(4, 1), Episode(4, 2)]
    plans = {w: worker_plan(episodes, 8, 2, 2, w) for w in range(2)}
    assert plans[0] == [[(0, [Episode(4, 0)]), (4, [])], [(2, [Episode(4, 2)]), (6, [])]]
    assert plans[1] == [[(1, [Episode(4, 1)]), (5, [])], [(3, []), (7, [])]]


def test_round_robin_queues_and_task_major_order() -> None:
    episodes = list_episodes([0, 1, 2], 1)
    assert assign_episodes(episodes, 2) == [[Episode(0, 0), Episode(2, 0)], [Episode(1, 0)]]
    episodes = list_episodes([3, 7], 3)
    assert episodes == [Episode(3, 0), Episode(3, 1), Episode(3, 2), Episode(7, 0), Episode(7, 1), Episode(7, 2)]
    assert assign_episodes(episodes, 4) == [[Episode(3, 0), Episode(7, 1)], [Episode(3, 1), Episode(7, 2)],
                                            [Episode(3, 2)], [Episode(7, 0)]]
    assert assign_episodes(episodes, 1) == [episodes]


def test_a_suite_eval_keeps_each_stage_on_one_or_two_tasks() -> None:
    """libero_spatial's 10 tasks x 50 trials on 16 envs, 1 worker x 2 stages: the envs of a stage run
    their k-th episodes on at most 2 tasks (one prompt per request, mostly), where contiguous
    per-slot blocks had each stage's 8 envs on 8 different tasks at almost every k."""
    episodes = list_episodes(list(range(10)), 50)
    plan = worker_plan(episodes, 16, 1, 2, 0)
    for stage in plan:
        queues = [eps for _, eps in stage]
        for k in range(max(len(q) for q in queues)):
            assert len({q[k].task_id for q in queues if len(q) > k}) <= 2
    makes = [len({ep.task_id for ep in eps}) for stage in plan for _, eps in stage]
    assert max(makes) == 10  # the price: one env build per task per slot (was 1-2)


def test_stage_slot_ids_interleave_workers_then_stages() -> None:
    assert stage_slot_ids(0, 0, 8, 2, 2) == [0, 4]
    assert stage_slot_ids(1, 0, 8, 2, 2) == [1, 5]
    assert stage_slot_ids(0, 1, 8, 2, 2) == [2, 6]
    assert stage_slot_ids(1, 1, 8, 2, 2) == [3, 7]


def test_bad_layouts_are_rejected() -> None:
    with pytest.raises(ValueError, match="not a positive multiple"):
        worker_plan(list_episodes([0], 2), 5, 2, 1, 0)
    with pytest.raises(ValueError, match="outside"):
        stage_slot_ids(2, 0, 4, 2, 1)
    with pytest.raises(ValueError, match="duplicate task ids"):
        list_episodes([1, 1], 2)
    with pytest.raises(ValueError, match="trials_per_task"):
        list_episodes([1], 0)
    with pytest.raises(ValueError, match="num_slots"):
        assign_episodes([], 0)


def test_listed_init_states_select_exactly_those_episodes() -> None:
    """Held-out init states (e.g. 40..49 of a policy trained on 0..39) are listed by id."""
    episodes = list_episodes([0, 3], [40, 45, 49])
    assert episodes == [Episode(0, 40), Episode(0, 45), Episode(0, 49), Episode(3, 40), Episode(3, 45),
                        Episode(3, 49)]
    assert list_episodes([1], 3) == list_episodes([1], [0, 1, 2])
    with pytest.raises(ValueError, match="distinct"):
        list_episodes([1], [4, 4])
    with pytest.raises(ValueError, match="distinct"):
        list_episodes([1], [])
