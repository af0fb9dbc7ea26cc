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
    object_lift_m: dict[str, float] | None = None
    """Highest rise (metres) of each object the goal moves, above where it rested after settling, sampled
    after each chunk (``sim/object_lift.py``): ~0 for a missed grasp. ``None`` for an episode with an error."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (one ``results.jsonl`` line)."""
        return asdict(self)


def episode_log_line(result: EpisodeResult) -> str:
    """``[libero eval] task_id=.., trial_id=.., success=..`` exactly as RLinf's LIBERO eval logs it
    (success = ``success_once``), so existing log parsers keep working. An episode that could not be
    run gets ``, error=..`` appended: parsers count it as a failure, a reader sees why."""
    line = f"[libero eval] task_id={result.task_id}, trial_id={result.trial_id}, success={result.success_once}"
    return line if result.error is None else f"{line}, error={result.error}"
