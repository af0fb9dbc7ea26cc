"""Success rates that can be compared: counts, rate and the Wilson 95 % interval, per task and overall.

A success rate from 50 trials is uncertain by several points; reporting the Wilson score interval (as
LeRobot's eval does) with every rate keeps a reader from reading noise as progress. Pure Python.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

Z_95 = 1.959963984540054
G = TypeVar("G")


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial rate; ``(0, 1)`` when there are no trials."""
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes}/{trials}")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class SuccessRate:
    """``successes`` of ``trials`` with the rate and its Wilson 95 % interval."""

    successes: int
    trials: int

    @property
    def rate(self) -> float:
        return self.successes / self.trials if self.trials else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.trials)

    def to_dict(self) -> dict[str, Any]:
        low, high = self.ci95
        return {**asdict(self), "rate": self.rate, "ci95": [low, high]}

    def __str__(self) -> str:
        low, high = self.ci95
        return f"{self.rate:6.1%} [{low:5.1%}, {high:5.1%}] ({self.successes}/{self.trials})"


def success_by(results: Iterable[Mapping[str, Any]], group: Callable[[Mapping[str, Any]], G],
               key: str = "success_once") -> dict[G, SuccessRate]:
    """:class:`SuccessRate` of ``results.jsonl`` rows per ``group(row)``, sorted by group (an errored
    episode counts as a failure)."""
    counts: dict[G, list[int]] = defaultdict(lambda: [0, 0])
    for row in results:
        entry = counts[group(row)]
        entry[0] += int(bool(row[key]) and row.get("error") is None)
        entry[1] += 1
    return {g: SuccessRate(s, n) for g, (s, n) in sorted(counts.items())}


def success_by_task(results: Iterable[Mapping[str, Any]], key: str = "success_once") -> dict[int, SuccessRate]:
    """Per-task :class:`SuccessRate` of ``results.jsonl`` rows (an errored episode counts as a failure)."""
    return success_by(results, lambda row: int(row["task_id"]), key)


def overall(rates: Iterable[SuccessRate]) -> SuccessRate:
    """All trials pooled."""
    rates = list(rates)
    return SuccessRate(sum(r.successes for r in rates), sum(r.trials for r in rates))
