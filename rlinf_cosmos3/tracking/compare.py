"""Compare the success of two eval runs task by task: both rates with intervals, the difference, and
Fisher's exact test, so a change is called a regression only when the counts support it.

Episodes are matched by (suite, task); each run's rows are pooled per task as they are (the runs need
not have the same init states or trial counts, though comparing the same ones is what tells most).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scipy.stats import fisher_exact

from rlinf_cosmos3.tracking.success import SuccessRate, success_by

Task = tuple[str, int]
"""(suite, task id); the suite is '' for rows that do not name one."""


@dataclass(frozen=True)
class Comparison:
    """Run A against run B on one task (or pooled): B's rate minus A's, and Fisher's exact p-values."""

    name: str
    a: SuccessRate
    b: SuccessRate

    @property
    def difference(self) -> float:
        return self.b.rate - self.a.rate

    def _table(self) -> list[list[int]]:
        return [[self.a.successes, self.a.trials - self.a.successes],
                [self.b.successes, self.b.trials - self.b.successes]]

    @property
    def p_value(self) -> float:
        """Two-sided: are the two rates different at all."""
        return float(fisher_exact(self._table(), alternative="two-sided").pvalue)

    @property
    def p_worse(self) -> float:
        """One-sided: the evidence that B succeeds less often than A (small = a real regression)."""
        return float(fisher_exact(self._table(), alternative="greater").pvalue)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a.to_dict(), "b": self.b.to_dict(), "difference": self.difference,
                "p_value": self.p_value, "p_worse": self.p_worse}


def rates_by_task(rows: Iterable[Mapping[str, Any]], key: str = "success_once") -> dict[Task, SuccessRate]:
    """Per (suite, task) success counts; an episode with an error counts as a failure."""
    return success_by(rows, lambda row: (str(row.get("suite", "")), int(row["task_id"])), key)


@dataclass(frozen=True)
class RunComparison:
    """Every task both runs evaluated, the pooled comparison over those tasks, and the tasks only one has."""

    tasks: dict[Task, Comparison]
    pooled: Comparison
    only_a: list[Task]
    only_b: list[Task]

    def regressions(self, alpha: float) -> list[Comparison]:
        """Tasks (and the pooled row) where B is worse than A with one-sided p < ``alpha``."""
        return [c for c in [*self.tasks.values(), self.pooled] if c.p_worse < alpha]


def compare_runs(rows_a: Iterable[Mapping[str, Any]], rows_b: Iterable[Mapping[str, Any]],
                 key: str = "success_once") -> RunComparison:
    """Compare two runs' results rows on ``key`` (``success_once`` or ``success_at_end``)."""
    if key not in ("success_once", "success_at_end"):
        raise ValueError(f"key must be success_once or success_at_end, got {key!r}")
    a, b = rates_by_task(rows_a, key), rates_by_task(rows_b, key)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(f"the runs share no task (A: {_names(a)}; B: {_names(b)}): nothing to compare")
    tasks = {t: Comparison(_name(t), a[t], b[t]) for t in common}
    pooled = Comparison("all shared tasks", SuccessRate(sum(a[t].successes for t in common), sum(a[t].trials for t in common)),
                        SuccessRate(sum(b[t].successes for t in common), sum(b[t].trials for t in common)))
    return RunComparison(tasks, pooled, sorted(set(a) - set(b)), sorted(set(b) - set(a)))


def _name(task: Task) -> str:
    suite, task_id = task
    return f"{suite} task {task_id}" if suite else f"task {task_id}"


def _names(rates: Mapping[Task, SuccessRate]) -> str:
    return ", ".join(_name(t) for t in rates) or "none"
