"""What an eval reports: ``summary.json`` (per task, per suite and overall, each with its Wilson 95 %
interval), the table printed at the end and ``success.png``, all from the run's episode results.

A resumed run passes the kept rows with the new ones, so its summary is that of every episode once.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.tracking.success import SuccessRate, success_by
from rlinf_cosmos3.tracking.success_plot import plot_success
from rlinf_cosmos3.tracking.success_table import success_table
from rlinf_cosmos3.workers.env.results import EpisodeResult

logger = logging.getLogger("rlinf_cosmos3.eval")


@dataclass
class EvalSummary:
    """What ``summary.json`` holds."""

    suite: str
    """The suite, or the suites joined by ``+`` (``libero_spatial+libero_object``)."""
    num_trajectories: int
    success_once: float
    success_at_end: float
    num_errors: int
    per_task: dict[Any, dict[str, Any]]
    """Per task: keyed by task id in a one-suite run, by ``<suite>/<task id>`` with several suites."""
    step_cap: int | dict[str, int]
    """The cap of the run's suite; with several suites, each suite's cap by name."""
    num_settle_steps: int
    wall_time_s: float
    env_steps: int
    env_steps_per_s: float
    chunk_requests: int
    steady_time_s: float = 0.0
    """``wall_time_s`` from the end of the first observation (the first request) on: no env
    build, reset or first settle, which dominate short runs."""
    steady_env_steps: int = 0
    """``env_steps`` less the settle steps run inside the first observation."""
    steady_env_steps_per_s: float = 0.0
    inference_wait_s: float = 0.0
    """Summed over stage loops: time a stage waited for its actions (queueing + serving)."""
    sim_wait_s: float = 0.0
    """Summed over stage loops: time a stage waited for its chunk step. With perfect overlap a
    stage loop's ``inference + sim`` wait fills the wall time and the servers never idle."""
    open_loop_steps: int | None = None
    """Commands of each chunk run per request (``env.eval.open_loop_steps``); None: the whole chunk."""
    save_video: str = "none"
    videos: list[str] = field(default_factory=list)
    """The mp4s written (``save_video`` all: every episode, failures: those that did not succeed),
    in (task, trial) order, as in results.jsonl's ``video`` field."""
    suites: list[str] = field(default_factory=list)
    per_suite: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per suite: its cap, pooled rates with their intervals, and its ``per_task``."""
    init_states_from_task: dict[str, int] = field(default_factory=dict)
    """Instruction swap (``env.eval.init_states_from_task``): instructed task -> the task whose init states
    it started from; ``{}``: none. Each ``per_task`` entry names its ``init_state_task_id`` too."""
    instruction_override: str | None = None
    """Instruction ablation: the text every request carried instead of the task's (``per_task``'s
    ``instruction``); None: each task's own instruction."""
    success_once_ci95: list[float] = field(default_factory=lambda: [0.0, 1.0])
    success_at_end_ci95: list[float] = field(default_factory=lambda: [0.0, 1.0])
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["per_task"] = {str(k): v for k, v in self.per_task.items()}
        out["per_suite"] = {s: {**e, "per_task": {str(k): v for k, v in e["per_task"].items()}}
                            for s, e in self.per_suite.items()}
        extra = out.pop("extra")
        out.update(extra)
        return out


def rates_entry(results: list[EpisodeResult]) -> dict[str, Any]:
    """Pooled rates of ``results`` with their Wilson 95 % intervals (an episode with an error is a failure)."""
    entry: dict[str, Any] = {"num_trajectories": len(results)}
    for key in ("success_once", "success_at_end"):
        rate = SuccessRate(sum(bool(getattr(r, key)) and r.error is None for r in results), len(results))
        entry[key], entry[f"{key}_ci95"] = rate.rate, list(rate.ci95)
    return entry


def _per_task(results: list[EpisodeResult], key: Callable[[EpisodeResult], Any]) -> dict[Any, dict[str, Any]]:
    """Rates per task, each with the task whose init states it started from and the instruction it was sent
    (one of each per task in a run: both are set per task by the config)."""
    groups: dict[Any, list[EpisodeResult]] = defaultdict(list)
    for r in sorted(results, key=lambda r: (r.suite, r.task_id)):
        groups[key(r)].append(r)
    return {k: {**rates_entry(rs), "init_state_task_id": rs[0].init_state_task_id, "instruction": rs[0].instruction}
            for k, rs in groups.items()}


def condition_lines(init_states_from_task: Mapping[Any, int], instruction_override: str | None) -> list[str]:
    """What the run's log says of an instruction swap or ablation (nothing for a plain run)."""
    lines = [f"instruction swap: task {t} from task {s}'s init states (instruction and goal: task {t}'s)"
             for t, s in sorted((int(t), int(s)) for t, s in init_states_from_task.items())]
    if instruction_override is not None:
        lines.append(f"instruction ablation: every request carried {instruction_override!r} instead of the "
                     "task's instruction (success: the task's goal)")
    return lines


def video_entry(result: EpisodeResult, run_dir: Path | None) -> str | None:
    """results.jsonl's ``video``: the episode's mp4 relative to the run directory (absolute when
    ``env.eval.video_dir`` lies outside it), None when no video was written for it."""
    if result.video_path is None:
        return None
    path = Path(result.video_path).resolve()
    if run_dir is not None and path.is_relative_to(root := Path(run_dir).resolve()):
        return str(path.relative_to(root))
    return str(path)


def write_success_plot(results: list[EpisodeResult], path: Path, title: str) -> Path | None:
    """``success.png`` of the run (per-task success_once with intervals); a failure to draw is logged,
    never raised: results.jsonl and summary.json are already written."""
    words = {(r.suite, r.task_id): r.task_description for r in results}
    starts = {(r.suite, r.task_id): r.init_state_task_id for r in results}
    several = len({r.suite for r in results}) > 1
    rates = {}
    for (suite, task), rate in success_by([r.to_dict() for r in results], lambda row: (row["suite"], row["task_id"])).items():
        text = words[(suite, task)]
        name = f"{suite.removeprefix('libero_')} task {task}" if several else f"task {task}"
        if starts[(suite, task)] not in (None, task):  # an instruction swap
            name += f" from task {starts[(suite, task)]}'s states"
        rates[name + (f": {text[:42]}{'...' if len(text) > 42 else ''}" if text else "")] = rate
    try:
        return plot_success(rates, path, title)
    except (OSError, ValueError, RuntimeError) as err:
        logger.warning("could not draw %s (%s); the numbers are in summary.json", path, err)
        return None


def summarize(results: list[EpisodeResult], cfg: EvalConfig, wall_time_s: float, chunk_requests: int,
              steady_time_s: float = 0.0, first_settle_steps: int = 0,
              waits: tuple[float, float] = (0.0, 0.0), run_dir: Path | None = None) -> EvalSummary:
    """Success rates overall and per task (episodes with an error count as failures);
    ``first_settle_steps``: settle steps run inside the first observation (left out of the steady rate);
    ``waits``: (inference, sim) wait summed over stage loops; ``run_dir``: the video paths are
    listed relative to it."""
    env = cfg.env.eval
    n = len(results)
    suites, caps = env.resolved_suites(), env.step_caps()
    steps = sum(r.steps for r in results)
    pooled = rates_entry(results)
    per_suite = {}
    for suite in suites:
        rows = [r for r in results if r.suite == suite]
        per_suite[suite] = {"step_cap": caps[suite], **rates_entry(rows),
                            "per_task": _per_task(rows, lambda r: r.task_id)}
    return EvalSummary(
        suite=env.suite_label,
        num_trajectories=n,
        success_once=pooled["success_once"],  # 0.0 without episodes (SuccessRate.rate)
        success_at_end=pooled["success_at_end"],
        num_errors=sum(r.error is not None for r in results),
        per_task=_per_task(results, (lambda r: f"{r.suite}/{r.task_id}") if env.multi_suite else (lambda r: r.task_id)),
        step_cap=caps if env.multi_suite else caps[suites[0]],
        num_settle_steps=env.num_settle_steps,
        open_loop_steps=env.open_loop_steps,
        wall_time_s=wall_time_s,
        env_steps=steps,
        env_steps_per_s=steps / wall_time_s if wall_time_s > 0 else 0.0,
        chunk_requests=chunk_requests,
        steady_time_s=steady_time_s,
        steady_env_steps=steps - first_settle_steps,
        steady_env_steps_per_s=(steps - first_settle_steps) / steady_time_s if steady_time_s > 0 else 0.0,
        inference_wait_s=waits[0],
        sim_wait_s=waits[1],
        save_video=env.save_video,
        videos=[v for r in sorted(results, key=lambda r: (r.task_id, r.trial_id))
                if (v := video_entry(r, run_dir)) is not None],
        suites=suites,
        per_suite=per_suite,
        init_states_from_task={str(t): int(s) for t, s in sorted(env.init_states_from_task.items())},
        instruction_override=env.instruction_override,
        success_once_ci95=pooled["success_once_ci95"],
        success_at_end_ci95=pooled["success_at_end_ci95"],
    )


def caps_text(step_cap: int | dict[str, int]) -> str:
    """``220``, or ``spatial 220, object 280`` for a run of several suites."""
    if isinstance(step_cap, int):
        return str(step_cap)
    return ", ".join(f"{suite.removeprefix('libero_')} {cap}" for suite, cap in step_cap.items())


def write_summary(summary: EvalSummary, results: list[EpisodeResult], run_dir: Path) -> None:
    """summary.json and success.png of all ``results`` (a resumed run: the kept rows too)."""
    (run_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2))
    step_caps = {summary.suites[0]: summary.step_cap} if isinstance(summary.step_cap, int) else summary.step_cap
    logger.info("success rates, Wilson 95 %% intervals (an episode with an error is a failure):\n%s",
                success_table([r.to_dict() for r in results], step_caps))
    for line in condition_lines(summary.init_states_from_task, summary.instruction_override):
        logger.info("%s", line)
    write_success_plot(results, run_dir / "success.png", f"{summary.suite}: success_once, cap "
                       f"{caps_text(summary.step_cap)} steps, {summary.num_trajectories} episodes")
