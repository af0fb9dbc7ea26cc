"""Compare two eval runs task by task, with intervals and Fisher's exact test; exit 1 on a regression.

    .venv/bin/python toolkits/eval/compare_runs.py RUN_A[:INIT_STATES] RUN_B[:INIT_STATES] [--key success_once] \
        [--alpha 0.05] [--json out.json]

RUN_A is the reference (e.g. yesterday's checkpoint), RUN_B the candidate; each is an eval run directory
(the ``logs/<timestamp>-<config>`` that ``evaluations/run_eval.sh`` printed, holding results.jsonl),
optionally with the init states to compare (``run:0-39``: the trained ones of a run that evaluated 0-49). For
every task both runs evaluated it prints both success rates with their Wilson 95 % intervals, B - A, the
two-sided Fisher p-value (are they different at all) and the one-sided one (is B worse), then the same
for all shared tasks pooled. Tasks are the instructed ones (success is their goal): a run with an instruction
ablation or swap (``env.eval.instruction_override`` / ``init_states_from_task``) is compared task by task with a
plain one, and its conditions are listed -- so ``compare_runs.py INSTRUCTED ABLATED`` gives, per task and
pooled, the one-sided Fisher p that the ablation lowers the success (column ``p (B worse)``); and
``compare_runs.py AFTER BEFORE`` the p that a training step (e.g. RL from its SFT start) raised it. Exit codes: 0 no significant regression, 1 B is worse than A on some task or
pooled with one-sided p < --alpha (a CI gate), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlinf_cosmos3.tracking.compare import Comparison, RunComparison, compare_runs
from rlinf_cosmos3.tracking.results_file import read_results, split_run_spec


def _line(c: Comparison) -> str:
    return (f"{c.name:<28} {c.a!s:>30} {c.b!s:>30} {c.difference:>+8.1%} {c.p_value:>9.3g} {c.p_worse:>9.3g}")


def read_run(spec: str) -> list[dict]:
    """``RUN_DIR[:INIT_STATES]`` -> its results rows, only those init states when given."""
    run, wanted = split_run_spec(spec)
    rows = read_results(run, wanted)
    if not rows:
        raise ValueError(f"{spec!r}: no episode of init states {spec.partition(':')[2]} in {run}")
    return rows


def print_conditions(result: RunComparison) -> None:
    """Which tasks of each run ran under an instruction swap or ablation (nothing for plain runs)."""
    for side, conditions in (("A", result.conditions_a), ("B", result.conditions_b)):
        for cond in conditions.values():
            print(f"{side} ran {cond.label}")


def print_table(result: RunComparison, alpha: float) -> None:
    print_conditions(result)
    print(f"{'task':<28} {'A':>30} {'B':>30} {'B - A':>8} {'p (2-sided)':>9} {'p (B worse)':>9}")
    for c in result.tasks.values():
        print(_line(c))
    print(_line(result.pooled))
    for side, tasks in (("A", result.only_a), ("B", result.only_b)):
        if tasks:
            print(f"only in {side} (not compared): " + ", ".join(f"{s} task {t}".strip() for s, t in tasks))
    worse = result.regressions(alpha)
    print(f"regression at alpha={alpha:g}: " + (", ".join(c.name for c in worse) if worse else "none"))


def _resolved(spec: str) -> str:
    run, colon, ids = spec.partition(":")
    return str(Path(run).resolve()) + colon + ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", help="reference eval run directory, optionally :INIT_STATES (e.g. run:0-39)")
    parser.add_argument("run_b", help="candidate eval run directory, optionally :INIT_STATES")
    parser.add_argument("--key", choices=("success_once", "success_at_end"), default="success_once")
    parser.add_argument("--alpha", type=float, default=0.05, help="one-sided significance level of a regression")
    parser.add_argument("--json", type=Path, help="also write the comparison here")
    args = parser.parse_args(argv)
    if not 0 < args.alpha < 1:
        print(f"error: --alpha must be in (0, 1), got {args.alpha}", file=sys.stderr)
        return 2
    try:
        result = compare_runs(read_run(args.run_a), read_run(args.run_b), args.key)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"A = {args.run_a}\nB = {args.run_b}\n{args.key}, Wilson 95 % intervals, Fisher's exact test")
    print_table(result, args.alpha)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"run_a": _resolved(args.run_a), "run_b": _resolved(args.run_b), "key": args.key,
               "alpha": args.alpha, "tasks": [c.to_dict() for c in result.tasks.values()],
               "pooled": result.pooled.to_dict(),
               "only_a": [list(t) for t in result.only_a], "only_b": [list(t) for t in result.only_b],
               "conditions_a": [c.label for c in result.conditions_a.values()],
               "conditions_b": [c.label for c in result.conditions_b.values()],
               "regressions": [c.name for c in result.regressions(args.alpha)]}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if result.regressions(args.alpha) else 0


if __name__ == "__main__":
    sys.exit(main())
