"""What one evaluated episode produced, and the per-episode log line of the reference eval."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class EpisodeResult:
    """One (task, init state) episode, reported exactly once.

    ``steps`` counts every simulator step after the reset, settle steps included (the quantity the
    cap bounds). ``success_once``: some policy step was successful; ``success_at_end``: the last
    step was. ``error`` is set (and both flags are False) when the episode could not be completed,
    e.g. its simulator process crashed on every allowed attempt.
    """

    suite: str
    task_id: int
    trial_id: int
    success_once: bool
    success_at_end: bool
    steps: int
    video_path: str | None = None
    error: str | None = None
    slot_id: int = -1
    attempts: int = 1
    """Simulator runs this episode took (1 + re-runs after crashes)."""
    task_description: str = ""
    """The task's own instruction (LIBERO's ``task.language``), whatever the policy was sent."""
    instruction: str | None = None
    """What the policy was actually prompted with: ``task_description``, or ``env.eval.instruction_override``
    (an ablation). None only in rows written before the field existed."""
    init_state_task_id: int | None = None
    """The task whose fixed init state ``trial_id`` the episode started from: ``task_id`` itself, or
    another task of the scene under ``env.eval.init_states_from_task`` (a swap: instruction and goal
    are still ``task_id``'s). None only in rows written before the field existed."""
    object_lift_m: dict[str, float] | None = None
    """Highest rise (metres) of each object the goal moves, above where it rested after settling, sampled
    after each chunk (``sim/object_lift.py``): ~0 for a missed grasp. ``None`` for an episode with an error."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (one ``results.jsonl`` line)."""
        return asdict(self)


def episode_log_line(result: EpisodeResult) -> str:
    """``[libero eval] task_id=.., trial_id=.., success=..`` exactly as RLinf's LIBERO eval logs it
    (success = ``success_once``), so existing log parsers keep working. A swapped episode gets
    ``, init_state_task_id=..`` appended; an episode that could not be run ``, error=..`` (parsers count
    it as a failure, a reader sees why)."""
    line = f"[libero eval] task_id={result.task_id}, trial_id={result.trial_id}, success={result.success_once}"
    if result.init_state_task_id not in (None, result.task_id):  # after the reference's fields: parsers still read it
        line += f", init_state_task_id={result.init_state_task_id}"
    return line if result.error is None else f"{line}, error={result.error}"
