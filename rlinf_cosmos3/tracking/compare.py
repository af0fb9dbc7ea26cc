"""Compare the success of two eval runs task by task: both rates with intervals, the difference, and
Fisher's exact test, so a change is called a regression only when the counts support it.

Episodes are matched by (suite, task); each run's rows are pooled per task as they are (the runs need
not have the same init states or trial counts, though comparing the same ones is what tells most).
The task is the instructed one, whose goal is judged: a run with an instruction ablation or swap
(:mod:`~rlinf_cosmos3.tracking.conditions`) is compared with a plain one task by task, and each run's
swapped or ablated tasks are named (``conditions_a``/``conditions_b``) -- e.g. an instructed run A against
an ablated run B: ``p_worse`` is the one-sided Fisher p that the ablation lowers the success.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scipy.stats import fisher_exact

from rlinf_cosmos3.tracking.conditions import Condition, condition
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
    conditions_a: dict[Task, Condition] = field(default_factory=dict)
    """A's tasks run under an instruction swap or ablation (the others ran plain)."""
    conditions_b: dict[Task, Condition] = field(default_factory=dict)

    def regressions(self, alpha: float) -> list[Comparison]:
        """Tasks (and the pooled row) where B is worse than A with one-sided p < ``alpha``."""
        return [c for c in [*self.tasks.values(), self.pooled] if c.p_worse < alpha]


def compare_runs(rows_a: Iterable[Mapping[str, Any]], rows_b: Iterable[Mapping[str, Any]],
                 key: str = "success_once") -> RunComparison:
    """Compare two runs' results rows on ``key`` (``success_once`` or ``success_at_end``)."""
    if key not in ("success_once", "success_at_end"):
        raise ValueError(f"key must be success_once or success_at_end, got {key!r}")
    rows_a, rows_b = list(rows_a), list(rows_b)
    a, b = rates_by_task(rows_a, key), rates_by_task(rows_b, key)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(f"the runs share no task (A: {_names(a)}; B: {_names(b)}): nothing to compare")
    tasks = {t: Comparison(_name(t), a[t], b[t]) for t in common}
    pooled = Comparison("all shared tasks", SuccessRate(sum(a[t].successes for t in common), sum(a[t].trials for t in common)),
                        SuccessRate(sum(b[t].successes for t in common), sum(b[t].trials for t in common)))
    return RunComparison(tasks, pooled, sorted(set(a) - set(b)), sorted(set(b) - set(a)),
                         _conditions(rows_a), _conditions(rows_b))


def _conditions(rows: Iterable[Mapping[str, Any]]) -> dict[Task, Condition]:
    """Per (suite, task), the condition of its swapped or ablated rows (a run sets one per task)."""
    out = {}
    for row in rows:
        cond = condition(row)
        if cond.swapped or cond.ablated:
            out[(cond.suite, cond.task_id)] = cond
    return dict(sorted(out.items()))


def _name(task: Task) -> str:
    suite, task_id = task
    return f"{suite} task {task_id}" if suite else f"task {task_id}"


def _names(rates: Mapping[Task, SuccessRate]) -> str:
    return ", ".join(_name(t) for t in rates) or "none"


def ablation_comparison(instructed: Iterable[Mapping[str, Any]], ablated: Iterable[Mapping[str, Any]],
                        key: str = "success_once") -> RunComparison:
    """Instructed rows (A) against instruction-ablated rows (B) task by task: ``p_worse`` is the one-sided
    Fisher p that the ablated policy succeeds less often. Raises ``ValueError`` when A holds an ablated row,
    B a row with its task's own instruction, or a task starts from other init states in A than in B (the
    swap would be mixed into the ablation)."""
    instructed, ablated = list(instructed), list(ablated)
    wrong_a = sorted({condition(r).label for r in instructed if condition(r).ablated})
    if wrong_a:
        raise ValueError(f"the instructed rows include ablated ones ({', '.join(wrong_a)}): give the runs "
                         "evaluated with each task's own instruction (env.eval.instruction_override=null)")
    wrong_b = sorted({condition(r).label for r in ablated if not condition(r).ablated})
    if wrong_b:
        raise ValueError(f"the ablated rows include rows sent their task's own instruction ({', '.join(wrong_b)}): "
                         "give the runs evaluated with env.eval.instruction_override set (rows without an "
                         "'instruction' field were written before ablations existed)")
    starts_a = {(c.suite, c.task_id): c.init_state_task_id for c in map(condition, instructed)}
    starts_b = {(c.suite, c.task_id): c.init_state_task_id for c in map(condition, ablated)}
    mixed = sorted(t for t in set(starts_a) & set(starts_b) if starts_a[t] != starts_b[t])
    if mixed:
        raise ValueError("tasks start from other init states in the instructed rows than in the ablated ones: "
                         + ", ".join(f"{_name(t)} from task {starts_a[t]}'s vs task {starts_b[t]}'s" for t in mixed)
                         + "; compare runs with the same env.eval.init_states_from_task")
    return compare_runs(instructed, ablated, key)
