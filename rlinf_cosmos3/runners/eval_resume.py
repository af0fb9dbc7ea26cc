"""Resume an interrupted eval: keep the episodes its ``results.jsonl`` already holds, run the rest.

``runner.resume_dir=<run dir>`` points a new eval at an earlier run directory. The new run writes
into that same directory: the log is appended to, ``config.yaml`` is left as the original run wrote
it, ``results.jsonl`` is rewritten with the kept rows and then appended to as episodes finish, and
``summary.json``/``success.png`` are computed from all rows, so every (task, init state) is counted
exactly once.

Only settings that do not change an episode's outcome may differ from the original run (the env
layout, batching, servers, timeouts, videos); the others (:func:`episode_settings`) are compared with
the saved ``config.yaml`` and a difference is refused before Ray or a simulator starts. Episodes
whose row carries an ``error`` (a simulator that crashed on every attempt) are run again: an error is
an accident of that run, not the policy's result, and the new row replaces the old one. A torn last
line (the process was killed while writing it) is dropped with a warning; that episode is re-run.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from rlinf_cosmos3.config.base import ConfigError, load_structured
from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.tracking.results_file import RESULTS_FILE, read_results
from rlinf_cosmos3.tracking.run_dir import RunDir, setup_run_logging
from rlinf_cosmos3.workers.env.episodes import Episode, eval_episodes
from rlinf_cosmos3.workers.env.results import EpisodeResult

logger = logging.getLogger("rlinf_cosmos3.eval")

FIELD = "runner.resume_dir"
CONFIG_FILE = "config.yaml"  # RunDir.config_file
_RESULT_FIELDS = {f.name for f in fields(EpisodeResult)}


@dataclass(frozen=True)
class ResumeState:
    """What a resumed run starts from: the rows it keeps and the episodes still to run (in list order)."""

    kept: list[EpisodeResult]
    remaining: list[Episode]
    rerun_errors: int = 0


def resumable_dir(raw_cfg: Any) -> Path | None:
    """``runner.resume_dir`` of a resolved config when it is an eval run directory (results.jsonl and
    config.yaml), else None: the run then gets a fresh directory, where the config check says why."""
    value = (raw_cfg.get("runner") or {}).get("resume_dir") if hasattr(raw_cfg, "get") else None
    if not value:
        return None
    path = Path(value)
    return path if (path / RESULTS_FILE).is_file() and (path / CONFIG_FILE).is_file() else None


def start_resumed_run(root: Path, log_name: str) -> RunDir:
    """The resumed run directory itself: logging appends to its log; its config.yaml stays the original's."""
    run_dir = RunDir(root=root, log_file=root / log_name)
    setup_run_logging(run_dir)
    logger.info("run directory: %s (resuming: runner.resume_dir)", run_dir.root)
    return run_dir


def episode_settings(cfg: EvalConfig) -> dict[str, Any]:
    """The settings that decide what an episode does and scores (paths resolved); all must match to resume."""
    env = cfg.env.eval
    out: dict[str, Any] = {
        "env.eval.suites": env.resolved_suites(),
        # per suite by name only with several suites: a one-suite refusal then reads "[0] -> [1]"
        "env.eval.task_ids": {suite: env.resolved_task_ids(suite) for suite in env.resolved_suites()}
        if env.multi_suite else env.resolved_task_ids(),
        "env.eval.init_state_ids": env.resolved_init_state_ids(),
        "env.eval.max_episode_steps": env.step_caps() if env.multi_suite else env.resolved_max_episode_steps(),
        "env.eval.num_settle_steps": env.num_settle_steps, "env.eval.stop_on_success": env.stop_on_success,
        "env.eval.open_loop_steps": env.open_loop_steps,
        "env.eval.seed": env.seed, "env.eval.image_size": env.image_size,
        "env.eval.init_states_from_task": {int(t): int(s) for t, s in sorted(env.init_states_from_task.items())},
        "env.eval.instruction_override": env.instruction_override,
        "rollout.rollout_backend": cfg.rollout.rollout_backend,
    }
    model = cfg.rollout.model
    for f in fields(model):
        value = getattr(model, f.name)
        out[f"rollout.model.{f.name}"] = str(Path(value).resolve()) if f.name.endswith("_path") else value
    return out


def prepare_resume(cfg: EvalConfig) -> ResumeState:
    """Compare ``cfg`` with the resumed run's config.yaml, read its rows, rewrite results.jsonl with the
    rows kept (a torn tail or an errored episode's row dropped); raises :class:`ConfigError` on a mismatch."""
    cfg.runner.validate()
    root = Path(str(cfg.runner.resume_dir))
    try:
        saved = load_structured(EvalConfig, yaml.safe_load((root / CONFIG_FILE).read_text()))
    except (ConfigError, yaml.YAMLError) as err:
        raise ConfigError(FIELD, f"{root / CONFIG_FILE} does not load as an eval config ({err})",
                          "resume only runs written by this version of evaluations/run_eval.sh") from err
    old, new = episode_settings(saved), episode_settings(cfg)
    changed = [key for key in new if old.get(key) != new[key]]
    if changed:
        diffs = ", ".join(f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in changed)
        raise ConfigError(FIELD, f"the resumed run's episodes were defined differently ({diffs})",
                          f"use the settings of {root / CONFIG_FILE}, or leave runner.resume_dir unset for a new run")
    rows = _read_rows(root)
    episodes = eval_episodes(cfg.env.eval)
    wanted = set(episodes)
    kept: list[EpisodeResult] = []
    errors = 0
    for row in rows:
        episode = Episode(int(row["task_id"]), int(row["trial_id"]), str(row.get("suite", "")))
        if episode not in wanted:
            raise ConfigError(FIELD, f"{root / RESULTS_FILE} holds episode (task {episode.task_id}, init state "
                              f"{episode.trial_id}) of suite {row.get('suite')!r}, not one of this config's", "resume the run directory "
                              "whose config.yaml this is; the results file was edited or copied in")
        if row.get("error") is not None:
            errors += 1
            continue
        kept.append(EpisodeResult(**{k: v for k, v in row.items() if k in _RESULT_FIELDS}))
    _rewrite(root / RESULTS_FILE, [r for r in rows if r.get("error") is None])
    done = {Episode(r.task_id, r.trial_id, r.suite) for r in kept}
    return ResumeState(kept, [e for e in episodes if e not in done], errors)


def _read_rows(root: Path) -> list[dict[str, Any]]:
    """read_results' rows; a last line cut off by a kill is dropped with a warning (its episode re-runs)."""
    try:
        return read_results(root, drop_torn_tail=True)
    except ValueError as err:
        raise ConfigError(FIELD, str(err), "resume only a run directory that evaluations/run_eval.sh wrote") from err


def _rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace ``path`` by ``rows`` atomically (a kill now leaves the old file or the new one)."""
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in rows)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
