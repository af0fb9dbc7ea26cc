"""The success table printed at the end of an eval: per task, per suite and overall, with intervals.

Reads ``results.jsonl`` rows (an errored episode counts as a failure), so a resumed or finished run's
file prints the same table as the run itself did. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rlinf_cosmos3.tracking.conditions import init_state_task
from rlinf_cosmos3.tracking.success import SuccessRate, success_by

KEYS = ("success_once", "success_at_end")
_TASK_WIDTH = 46


def _rates(rows: list[Mapping[str, Any]]) -> tuple[SuccessRate, SuccessRate]:
    once, at_end = (SuccessRate(sum(bool(r[k]) and r.get("error") is None for r in rows), len(rows)) for k in KEYS)
    return once, at_end


def _task_label(task_id: int, words: str, init_state_task_id: int) -> str:
    """``8 put the bowl ...``, or ``8 from task 1's init states: put the bowl ...`` under a swap."""
    swap = f" from task {init_state_task_id}'s init states:" if init_state_task_id != task_id else ""
    label = f"{task_id}{swap} {words}".strip()
    return label if len(label) <= _TASK_WIDTH else label[: _TASK_WIDTH - 3] + "..."


def success_table(rows: Iterable[Mapping[str, Any]], step_caps: Mapping[str, int]) -> str:
    """One line per (suite, task), one per suite (``all, cap N``) and, with several suites, one overall."""
    rows = list(rows)
    by_task = success_by(rows, lambda r: (str(r.get("suite", "")), int(r["task_id"])))
    words = {(str(r.get("suite", "")), int(r["task_id"])): str(r.get("task_description", "")) for r in rows}
    starts = {(str(r.get("suite", "")), int(r["task_id"])): init_state_task(r) for r in rows}
    suites = list(dict.fromkeys([*step_caps, *(suite for suite, _ in by_task)]))
    suite_width = max([len("all suites"), *(len(s) for s in suites)])
    head = f"{'suite':<{suite_width}}  {'task':<{_TASK_WIDTH}}  {'success_once':<30}  success_at_end"
    lines = [head, "-" * (len(head) + 16)]

    def line(suite: str, task: str, group: list[Mapping[str, Any]]) -> str:
        once, at_end = _rates(group)
        return f"{suite:<{suite_width}}  {task:<{_TASK_WIDTH}}  {once!s:<30}  {at_end!s}"

    for suite in suites:
        suite_rows = [r for r in rows if str(r.get("suite", "")) == suite]
        if not suite_rows:
            continue
        for (s, task_id) in by_task:
            if s == suite:
                lines.append(line(suite, _task_label(task_id, words[(s, task_id)], starts[(s, task_id)]),
                                  [r for r in suite_rows if int(r["task_id"]) == task_id]))
        cap = step_caps.get(suite)
        lines.append(line(suite, "all" + (f" (cap {cap} steps)" if cap is not None else ""), suite_rows))
    if len([s for s in suites if any(str(r.get("suite", "")) == s for r in rows)]) > 1:
        lines.append(line("all suites", "all", rows))
    return "\n".join(lines)
