"""Which (suite, task, init state) episodes exist and which env slot runs each of them; pure functions.

Every episode is assigned to exactly one slot, so it is evaluated exactly once however ``E`` relates
to the episode count. Episodes are listed task-major and dealt round-robin: slot ``g`` runs episodes
``g, g + E, g + 2E, ...`` (the first ``n % E`` slots one episode more). So the ``k``-th episodes of
all slots are ``E`` consecutive episodes -- mostly one task, hence one prompt, which is what lets a
stage's observations go out as one full request (SGLang batches only prompts of one token length; a
split into contiguous per-slot blocks put every slot on a different task at once). A slot's queue
stays task-major, so it rebuilds its LIBERO env once per task it reaches. Slots with no episode stay
idle (padding).

Global slot ids interleave workers, then stages: slot ``g`` lives on worker ``g % W``, stage
``(g // W) % S``, position ``g // (W*S)`` in that stage. Consecutive slots -- which get the larger
queues, and are the busy ones when there are fewer episodes than envs -- are therefore spread over
all workers and stages instead of piling onto the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from rlinf_cosmos3.config.env import EnvEvalConfig


class Episode(NamedTuple):
    """One evaluation episode: a task and a LIBERO fixed init state (``trial_id`` = init state id) of a suite."""

    task_id: int
    trial_id: int
    suite: str = ""
    """The LIBERO suite; "" only in the pure layout functions, which do not care."""
    reset_seed: int | None = None
    """The reset places the scene's jointless furniture from this seed (``LiberoSession.reset``), so the episode
    does not depend on the episodes its simulator ran before (RL: one per GRPO group, for an exact resume).
    None: from the simulator's own RNG, as LIBERO's eval (the eval's episodes)."""


class SlotAddress(NamedTuple):
    """Where a global slot lives: env worker rank, pipeline stage, position within the stage."""

    worker: int
    stage: int
    index: int


def list_episodes(task_ids: Sequence[int], init_states: int | Sequence[int], suite: str = "") -> list[Episode]:
    """Every (task, init state) pair of ``suite``, task-major, in a fixed order.

    ``init_states``: a count N (the init states ``0..N-1``) or the init state ids themselves.
    """
    if isinstance(init_states, int):
        if init_states < 1:
            raise ValueError(f"trials_per_task must be >= 1, got {init_states}")
        init_states = range(init_states)
    ids = [int(i) for i in init_states]
    if not ids or len(set(ids)) != len(ids):
        raise ValueError(f"init state ids must be distinct and non-empty, got {ids}")
    if len(set(task_ids)) != len(task_ids):
        raise ValueError(f"duplicate task ids: {list(task_ids)}")
    return [Episode(int(t), i, suite) for t in task_ids for i in ids]


def eval_episodes(cfg: EnvEvalConfig) -> list[Episode]:
    """Every episode of an ``env.eval`` section, suite-major, then task-major (each exactly once)."""
    return [episode for suite in cfg.resolved_suites()
            for episode in list_episodes(cfg.resolved_task_ids(suite), cfg.resolved_init_state_ids(), suite)]


def assign_episodes(episodes: Sequence[Episode], num_slots: int) -> list[list[Episode]]:
    """Deal ``episodes`` round-robin over ``num_slots`` queues: queue ``g`` is ``episodes[g::num_slots]``."""
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    return [list(episodes[slot::num_slots]) for slot in range(num_slots)]


def _check_layout(total_num_envs: int, num_workers: int, num_stages: int) -> int:
    if num_workers < 1 or num_stages < 1:
        raise ValueError(f"need >= 1 worker and stage, got {num_workers} workers, {num_stages} stages")
    groups = num_workers * num_stages
    if total_num_envs < 1 or total_num_envs % groups:
        raise ValueError(f"total_num_envs={total_num_envs} is not a positive multiple of "
                         f"num_workers x pipeline_stage_num = {groups}")
    return total_num_envs // groups


def slot_address(slot_id: int, num_workers: int, num_stages: int) -> SlotAddress:
    """Global slot id -> (worker, stage, index); see the module docstring."""
    if slot_id < 0:
        raise ValueError(f"slot ids are >= 0, got {slot_id}")
    return SlotAddress(slot_id % num_workers, (slot_id // num_workers) % num_stages,
                       slot_id // (num_workers * num_stages))


def global_slot_id(address: SlotAddress, num_workers: int, num_stages: int) -> int:
    """Inverse of :func:`slot_address`."""
    return (address.index * num_stages + address.stage) * num_workers + address.worker


def stage_slot_ids(worker: int, stage: int, total_num_envs: int, num_workers: int, num_stages: int) -> list[int]:
    """Global ids of the ``E/(W*S)`` slots of one worker's stage, by position in the stage."""
    per_stage = _check_layout(total_num_envs, num_workers, num_stages)
    if not (0 <= worker < num_workers and 0 <= stage < num_stages):
        raise ValueError(f"worker {worker} / stage {stage} outside {num_workers} workers x {num_stages} stages")
    return [global_slot_id(SlotAddress(worker, stage, i), num_workers, num_stages) for i in range(per_stage)]


def worker_plan(episodes: Sequence[Episode], total_num_envs: int, num_workers: int, num_stages: int,
                worker: int) -> list[list[tuple[int, list[Episode]]]]:
    """For each stage of ``worker``: ``(global slot id, its episodes in order)`` per slot position."""
    _check_layout(total_num_envs, num_workers, num_stages)
    queues = assign_episodes(episodes, total_num_envs)
    return [[(g, queues[g]) for g in stage_slot_ids(worker, s, total_num_envs, num_workers, num_stages)]
            for s in range(num_stages)]
