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

Rows of an instruction swap or ablation (issue #31: ``env.eval.init_states_from_task``,
``env.eval.instruction_override``) are not pooled into their task's row: a group lists them apart under
``conditions`` (``task 8 from task 1's init states``, ``task 0, instruction ''``), each with its interval.
``--ablation INSTRUCTED ABLATED`` (two group names) adds the one-sided Fisher exact test that the ablated
groups' success is lower, per task and pooled (``ablation_test``), and the same test on only the episodes
that lifted the object (``ablation_test_lifted``): grasping is the same skill under any instruction, so
whether a lifted object reaches the instructed goal is what the instruction decides. Each group also
reports, per task and condition, how many episodes lifted the object and how many of those reached the
goal (``after_lift``)::

    .venv/bin/python toolkits/eval/success_report.py --out report.json \
        --group trained logs/<run>:0-39 --group held_out logs/<run>:40-49 \
        --group swap logs/<swap run> --group ablated logs/<ablated run>:40-49 --ablation held_out ablated
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlinf_cosmos3.sim.object_lift import LIFTED_M, lift_label
from rlinf_cosmos3.tracking.compare import RunComparison, ablation_comparison
from rlinf_cosmos3.tracking.conditions import condition
from rlinf_cosmos3.tracking.results_file import read_results, split_run_spec
from rlinf_cosmos3.tracking.success import SuccessRate, overall, success_by, success_by_task

KEYS = ("success_once", "success_at_end")


def read_group(spec: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``RUN_DIR[:IDS]`` -> its selected results rows and where they came from."""
    try:
        run, wanted = split_run_spec(spec)
    except ValueError as err:
        raise ValueError(f"--group {err}") from err
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


def _is_plain(row: dict[str, Any]) -> bool:
    cond = condition(row)
    return not (cond.swapped or cond.ablated)


def _rates(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Per plain task, per swap/ablation condition, and all rows pooled."""
    others = [r for r in rows if not _is_plain(r)]
    named = {c.sort_key: c for c in map(condition, others)}
    conditions = {named[k]: rate for k, rate in success_by(others, lambda r: condition(r).sort_key, key).items()}
    return {"tasks": {str(t): r.to_dict() for t, r in success_by_task([r for r in rows if _is_plain(r)], key).items()},
            "conditions": [{"label": c.label, "task_id": c.task_id, "init_state_task_id": c.init_state_task_id,
                            "instruction": c.ablated_instruction, **r.to_dict()} for c, r in conditions.items()],
            "overall": overall(success_by_task(rows, key).values()).to_dict()}


def lifted(row: dict[str, Any]) -> bool:
    """The episode picked up an object its goal moves (``object_lift_m`` above :data:`LIFTED_M`)."""
    lift = row.get("object_lift_m")
    return bool(lift) and max(lift.values()) > LIFTED_M


def _after_lift(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task / condition and pooled: episodes with the lift measured, those that lifted the object, and
    the success (once) of the lifted ones: where the object went once the grasp had worked."""
    measured = [r for r in rows if r.get("object_lift_m")]
    up = [r for r in measured if lifted(r)]
    by_label = success_by(up, lambda r: condition(r).sort_key)
    counts = {k: rate.trials for k, rate in success_by(measured, lambda r: condition(r).sort_key).items()}
    named = {condition(r).sort_key: condition(r).label for r in measured}
    return {"conditions": [{"label": named[k], "measured": counts[k],
                            "lifted": by_label[k].trials if k in by_label else 0,
                            "success_given_lifted": (by_label[k] if k in by_label else SuccessRate(0, 0)).to_dict()}
                           for k in sorted(counts)],
            "overall": {"measured": len(measured), "lifted": len(up),
                        "success_given_lifted": overall(by_label.values()).to_dict()}}


def _ablation_doc(names: tuple[str, str], result: RunComparison) -> dict[str, Any]:
    return {"instructed": names[0], "ablated": names[1], "key": "success_once",
            "test": "one-sided Fisher exact: the ablated rows succeed less often than the instructed ones",
            "tasks": [c.to_dict() for c in result.tasks.values()], "pooled": result.pooled.to_dict(),
            "only_instructed": [list(t) for t in result.only_a], "only_ablated": [list(t) for t in result.only_b]}


def report(groups: list[tuple[str, str]], ablation: tuple[str, str] | None = None) -> dict[str, Any]:
    """The JSON document: per group, per task, per swap/ablation condition and overall success (once and at
    end) with intervals; with ``ablation`` (instructed group, ablated group) the Fisher test between them."""
    pooled: dict[str, dict[str, Any]] = {}
    for name, spec in groups:
        if name.startswith("ablation_test"):
            raise ValueError(f"--group {name}: names starting 'ablation_test' are the report's own keys for "
                             "--ablation; pick another")
        rows, source = read_group(spec)
        entry = pooled.setdefault(name, {"rows": [], "sources": []})
        entry["rows"] += rows
        entry["sources"].append(source)
    out: dict[str, Any] = {}
    for name, entry in pooled.items():
        out[name] = {"sources": entry["sources"], **{key: _rates(entry["rows"], key) for key in KEYS},
                     "after_lift": _after_lift(entry["rows"])}
    if ablation is not None:
        unknown = [n for n in ablation if n not in pooled]
        if unknown:
            raise ValueError(f"--ablation names group(s) {unknown} that no --group defines ({sorted(pooled)})")
        if ablation[0] == ablation[1]:
            raise ValueError(f"--ablation needs two groups, got {ablation[0]!r} twice")
        result = ablation_comparison(pooled[ablation[0]]["rows"], pooled[ablation[1]]["rows"])
        out["ablation_test"] = _ablation_doc(ablation, result)
        up = [[r for r in pooled[n]["rows"] if lifted(r)] for n in ablation]
        if all(up):
            out["ablation_test_lifted"] = _ablation_doc(ablation, ablation_comparison(*up))
    return out


def _print_rate(label: str, rate: dict[str, Any]) -> None:
    low, high = rate["ci95"]
    print(f"  {label}: success_once {rate['rate']:6.1%} [{low:5.1%}, {high:5.1%}] ({rate['successes']}/{rate['trials']})")


def print_ablation_test(doc: dict[str, Any], among: str = "") -> None:
    """The instructed-vs-ablated rows: both rates with intervals, the difference, the one-sided Fisher p."""
    print(f"ablation test{among}, success_once: {doc['instructed']} (instructed) vs {doc['ablated']} (ablated), "
          "one-sided Fisher exact p that the ablation lowers the success")
    for c in [*doc["tasks"], doc["pooled"]]:
        a, b = (SuccessRate(c[s]["successes"], c[s]["trials"]) for s in ("a", "b"))
        print(f"  {c['name']:<26} instructed {a!s:<30} ablated {b!s:<30} {c['difference']:+7.1%}  "
              f"p = {c['p_worse']:.4g}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", nargs=2, action="append", metavar=("NAME", "RUN[:INIT_STATES]"), required=True)
    parser.add_argument("--ablation", nargs=2, metavar=("INSTRUCTED", "ABLATED"),
                        help="two group names: one-sided Fisher exact test that ABLATED succeeds less often")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    try:
        doc = report([tuple(g) for g in args.group], tuple(args.ablation) if args.ablation else None)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, entry in doc.items():
        if name.startswith("ablation_test"):
            continue
        print(f"{name}: {sum(s['episodes'] for s in entry['sources'])} episodes")
        for task, rate in entry["success_once"]["tasks"].items():
            _print_rate(f"task {task}", rate)
        for rate in entry["success_once"]["conditions"]:
            _print_rate(rate["label"], rate)
        for source in entry["sources"]:
            for task, ids in source["failed_init_states"].items():
                missed = source["failed_never_lifted"].get(task, [])
                print(f"  failed, task {task}, {Path(source['run']).name}: {ids}"
                      + (f" (never lifted the object: {missed})" if missed else ""))
        after = entry["after_lift"]
        if after["overall"]["measured"]:
            parts = [f"{c['label']} {c['success_given_lifted']['successes']}/{c['lifted']}" for c in after["conditions"]]
            total = after["overall"]
            print(f"  reached the goal after lifting the object: {', '.join(parts)}; all "
                  f"{str(SuccessRate(total['success_given_lifted']['successes'], total['lifted'])).strip()}")
    if "ablation_test" in doc:
        print_ablation_test(doc["ablation_test"])
    if "ablation_test_lifted" in doc:
        print_ablation_test(doc["ablation_test_lifted"], " among episodes that lifted the object")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
