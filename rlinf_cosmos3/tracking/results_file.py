"""Read an eval run's ``results.jsonl``: one row per episode, checked, each episode once.

The toolkits that report on or compare eval runs (``success_report.py``, ``compare_runs.py``) read
runs through here, so a cut-off file, a directory that is not an eval run, or an episode listed twice
fails the same way everywhere, with the fix in the message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlinf_cosmos3.id_lists import parse_id_list

RESULTS_FILE = "results.jsonl"
REQUIRED_FIELDS = ("task_id", "trial_id", "success_once", "success_at_end")

logger = logging.getLogger(__name__)


def split_run_spec(spec: str) -> tuple[str, set[int] | None]:
    """``RUN_DIR[:INIT_STATES]`` (as the toolkits take a run) -> the run directory and its init states (None: all);
    a ``ValueError`` names the spec when the states are not ids or ranges."""
    run, _, ids = spec.partition(":")
    try:
        return run, set(parse_id_list([ids], "init states")) if ids else None
    except ValueError as err:
        raise ValueError(f"{spec!r}: init states must be ids or ranges such as 0-39 or 0,3,7 ({err})") from err


def episode_key(row: dict[str, Any]) -> tuple[str, int, int]:
    """What identifies an episode across runs: suite, task, init state (trial)."""
    return str(row.get("suite", "")), int(row["task_id"]), int(row["trial_id"])


def read_results(run_dir: str | Path, init_states: Iterable[int] | None = None, *,
                 drop_torn_tail: bool = False) -> list[dict[str, Any]]:
    """The rows of ``run_dir/results.jsonl`` (only the given init states, when given), file order.

    Raises ``FileNotFoundError`` when there is no results file and ``ValueError`` for a line that is
    not a complete row or an episode that appears twice (an eval writes each episode exactly once).
    ``drop_torn_tail``: a last line that is not JSON -- an eval killed while writing it -- is left out
    with a warning instead (what resuming that eval needs: the episode is simply run again).
    """
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {RESULTS_FILE} in eval run '{run_dir}' (give the run directory "
                                "logs/<timestamp>-<config> that evaluations/run_eval.sh printed)")
    lines = [(number, line) for number, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    if drop_torn_tail and lines and not _is_json(lines[-1][1]):
        logger.warning("%s:%d is cut off (the eval was killed while writing it); leaving it out", path, lines[-1][0])
        lines.pop()
    rows = [_row(line, path, number) for number, line in lines]
    seen: dict[tuple[str, int, int], int] = {}
    for number, row in enumerate(rows, 1):
        key = episode_key(row)
        if key in seen:
            raise ValueError(f"{path}: episode suite={key[0]!r} task {key[1]} init state {key[2]} appears twice "
                             f"(rows {seen[key]} and {number}); an eval writes each episode once: the file was "
                             "edited or two runs were concatenated - compare the run directories themselves")
        seen[key] = number
    if init_states is not None:
        wanted = set(init_states)
        rows = [r for r in rows if int(r["trial_id"]) in wanted]
    return rows


def episode_video(run_dir: str | Path, row: dict[str, Any]) -> Path | None:
    """The mp4 of a results row (its ``video`` is relative to the run directory, or absolute when the
    videos were written outside it), None when the eval wrote none for that episode."""
    video = row.get("video")
    if not video:
        return None
    return Path(video) if Path(video).is_absolute() else Path(run_dir) / video


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _row(line: str, path: Path, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{number} is not a JSON line ({err.msg}); the file is not an eval run's "
                         f"{RESULTS_FILE}, or it was cut off: give the run directory that evaluations/run_eval.sh "
                         "printed, or re-run the evaluation") from err
    missing = [key for key in REQUIRED_FIELDS if not isinstance(row, dict) or key not in row]
    if missing:
        raise ValueError(f"{path}:{number} lacks {missing}: not a {RESULTS_FILE} written by evaluations/run_eval.sh; "
                         "give the run directory that evaluations/run_eval.sh printed")
    return row
