"""Whether a learning proof's report (``success_report.py``'s JSON) meets its targets: one line per target.

The targets are those of docs/learning_proof.md, chosen by the suite and the number of tasks:

- one task: >= 90 % on the trained init states, >= 60 % on held-out ones;
- several libero_goal tasks (one scene; the language proof): held out >= 80 % pooled and >= 60 % for every
  task; with a ``swap`` group, success at the instructed goal from another task's init states >= 70 %; with an
  ``ablated`` group (one constant instruction), success <= 1/N + 10 points for N tasks, and lower than
  instructed with a one-sided Fisher p < 0.01 (the report's ``ablation_test``);
- several libero_object tasks: held out >= 80 % pooled and >= 50 % for every task;
- several tasks of another suite: held out >= 50 % for every task.

    python toolkits/eval/proof_targets.py report.json --suite libero_goal
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FISHER_ALPHA = 0.01


def _line(name: str, target: str, ok: bool | None, rate: Mapping[str, Any] | None, extra: str = "") -> str:
    if rate is None or not rate.get("trials"):
        return f"[learning_proof] target {name} {target}: no episodes"
    lo, hi = rate["ci95"]
    return (f"[learning_proof] target {name} {target}: {'met' if ok else 'NOT met'} - {rate['rate']:.1%} "
            f"({rate['successes']}/{rate['trials']}), Wilson 95 % [{lo:.1%}, {hi:.1%}]{extra}")


def _at_least(name: str, rate: Mapping[str, Any] | None, target: float) -> str:
    return _line(name, f">= {target:.0%}", rate is not None and rate.get("trials", 0) > 0 and rate["rate"] >= target,
                 rate)


def verdicts(report: Mapping[str, Any], suite: str) -> list[str]:
    """One line per target of ``report`` (a success_report JSON document) for a run on ``suite``."""
    def group(name: str) -> Mapping[str, Any]:
        return report.get(name, {}).get("success_once", {})

    tasks = sorted({t for name in ("trained", "held_out") for t in group(name).get("tasks", {})}, key=int)
    if len(tasks) <= 1:
        return [_at_least("trained", group("trained").get("overall"), 0.90),
                _at_least("held_out", group("held_out").get("overall"), 0.60)]
    held = group("held_out")
    per_task = {"libero_goal": 0.60, "libero_object": 0.50}.get(suite, 0.50)
    lines = []
    if suite in ("libero_goal", "libero_object"):
        lines.append(_at_least("held_out (all tasks)", held.get("overall"), 0.80))
    lines += [_at_least(f"held_out task {t}", held.get("tasks", {}).get(t), per_task) for t in tasks]
    if suite != "libero_goal":
        return lines
    if "swap" in report:
        lines.append(_at_least("swap (instructed goal from another task's init states)",
                               group("swap").get("overall"), 0.70))
    if "ablated" in report:
        ceiling = 1 / len(tasks) + 0.10
        rate = group("ablated").get("overall")
        lines.append(_line(f"ablated instruction ({len(tasks)} tasks)", f"<= {ceiling:.0%}",
                           rate is not None and rate.get("trials", 0) > 0 and rate["rate"] <= ceiling, rate))
    test = report.get("ablation_test")
    if test:
        p = test["pooled"]["p_worse"]
        lines.append(f"[learning_proof] target instructed > ablated (one-sided Fisher p < {FISHER_ALPHA}): "
                     f"{'met' if p < FISHER_ALPHA else 'NOT met'} - p = {p:.2g} "
                     f"({test['pooled']['a']['successes']}/{test['pooled']['a']['trials']} vs "
                     f"{test['pooled']['b']['successes']}/{test['pooled']['b']['trials']})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="success_report.py's JSON")
    parser.add_argument("--suite", default="libero_spatial")
    args = parser.parse_args(argv)
    for line in verdicts(json.loads(args.report.read_text()), args.suite):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
