"""Success rates with Wilson 95 % intervals over groups of evaluated episodes, as one JSON file.

    .venv/bin/python toolkits/eval/success_report.py --out report.json \\
        --group trained logs/<eval run A>:0-39 --group held_out logs/<eval run A>:40-49 \\
        --group held_out logs/<eval run B>

Each ``--group NAME RUN[:INIT_STATES]`` adds the episodes of an eval run directory (its
``results.jsonl``), optionally only those whose init state (trial id) is listed; a name given several
times pools its runs (e.g. the same held-out states under other policy seeds). Prints a table per group.
Each source also lists its failed init states per task (``success_once`` false; an episode with an
error is a failure), so which states fail under every seed reads off the JSON, and of those the ones
that never lifted the object the goal moves (``object_lift_m`` of the results: the grasp missed), so
missed grasps and later failures are counted apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlinf_cosmos3.id_lists import parse_id_list
from rlinf_cosmos3.sim.object_lift import lift_label
from rlinf_cosmos3.tracking.results_file import read_results
from rlinf_cosmos3.tracking.success import overall, success_by_task


def read_group(spec: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``RUN_DIR[:IDS]`` -> its selected results rows and where they came from."""
    run, _, ids = spec.partition(":")
    try:
        wanted = set(parse_id_list([ids], "init states")) if ids else None
    except ValueError as err:
        raise ValueError(f"--group {spec!r}: init states must be ids or ranges such as 0-39 or 0,3,7 ({err})") from err
    rows = read_results(run, wanted)
    failed: dict[str, list[int]] = {}
    never_lifted: dict[str, list[int]] = {}
    for row in rows:
        if not row["success_once"]:
            failed.setdefault(str(row["task_id"]), []).append(int(row["trial_id"]))
            if lift_label(row.get("object_lift_m")) == "never lifted":
                never_lifted.setdefault(str(row["task_id"]), []).append(int(row["trial_id"]))

    def by_task(ids: dict[str, list[int]]) -> dict[str, list[int]]:
        return {t: sorted(i) for t, i in sorted(ids.items(), key=lambda kv: int(kv[0]))}

    return rows, {"run": str(Path(run).resolve()), "init_states": sorted(wanted) if wanted else "all",
                  "episodes": len(rows), "failed_init_states": by_task(failed),
                  "failed_never_lifted": by_task(never_lifted)}


def report(groups: list[tuple[str, str]]) -> dict[str, Any]:
    """The JSON document: per group, per task and overall success (once and at end) with intervals."""
    pooled: dict[str, dict[str, Any]] = {}
    for name, spec in groups:
        rows, source = read_group(spec)
        entry = pooled.setdefault(name, {"rows": [], "sources": []})
        entry["rows"] += rows
        entry["sources"].append(source)
    out: dict[str, Any] = {}
    for name, entry in pooled.items():
        out[name] = {"sources": entry["sources"]}
        for key in ("success_once", "success_at_end"):
            tasks = success_by_task(entry["rows"], key)
            out[name][key] = {"tasks": {str(t): r.to_dict() for t, r in tasks.items()},
                              "overall": overall(tasks.values()).to_dict()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", nargs=2, action="append", metavar=("NAME", "RUN[:INIT_STATES]"), required=True)
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    try:
        doc = report([tuple(g) for g in args.group])
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, entry in doc.items():
        print(f"{name}: {sum(s['episodes'] for s in entry['sources'])} episodes")
        for task, rate in entry["success_once"]["tasks"].items():
            low, high = rate["ci95"]
            print(f"  task {task}: success_once {rate['rate']:6.1%} [{low:5.1%}, {high:5.1%}] "
                  f"({rate['successes']}/{rate['trials']})")
        for source in entry["sources"]:
            for task, ids in source["failed_init_states"].items():
                missed = source["failed_never_lifted"].get(task, [])
                print(f"  failed, task {task}, {Path(source['run']).name}: {ids}"
                      + (f" (never lifted the object: {missed})" if missed else ""))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
