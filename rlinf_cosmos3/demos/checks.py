"""Every input of a recording, checked before a simulator starts or the output directory is created.

A recording that fails on its inputs must fail in the first second, not after the simulators have
built their scenes, and must leave nothing behind: a half-created ``out`` would make the next,
corrected run refuse a non-empty directory. :func:`check_record_config` raises
:class:`~rlinf_cosmos3.config.base.ConfigError` naming the :class:`RecordConfig` field (the CLI maps
it to its flag) and the fix.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_cosmos3.config.base import ConfigError, require
from rlinf_cosmos3.config.libero_suites import NUM_INIT_STATES, SUITE_MAX_STEPS, SUITE_NUM_TASKS
from rlinf_cosmos3.demos.record_config import RECORDED_ACTIONS, RecordConfig
from rlinf_cosmos3.sim.client import require_simulator_python

SIMULATOR_FIELD = "RLINF_COSMOS3_LIBERO_PYTHON"
"""The setting that names the simulator environment (there is no config field for it)."""


def check_record_config(cfg: RecordConfig, camera_storages: tuple[str, ...]) -> None:
    """Raise ConfigError for the first input the recording cannot use (no process is started)."""
    require(cfg.suite in SUITE_MAX_STEPS, "suite", f"unknown LIBERO suite {cfg.suite!r}",
            f"use one of {sorted(SUITE_MAX_STEPS)}")
    num_tasks = SUITE_NUM_TASKS[cfg.suite]
    require(len(cfg.task_ids) > 0, "task_ids", "no task ids: nothing to record", "give at least one task id")
    bad = sorted({int(t) for t in cfg.task_ids if not 0 <= int(t) < num_tasks})
    require(not bad, "task_ids", f"{bad} out of range for {cfg.suite} ({num_tasks} tasks)",
            f"use ids in 0..{num_tasks - 1}")
    require(len(cfg.init_state_ids) > 0, "init_state_ids", "no init states: nothing to record",
            "give at least one init state")
    bad = sorted({int(i) for i in cfg.init_state_ids if not 0 <= int(i) < NUM_INIT_STATES})
    require(not bad, "init_state_ids", f"{bad} out of range (LIBERO has {NUM_INIT_STATES} fixed init states per "
            "task)", f"use ids in 0..{NUM_INIT_STATES - 1}")
    require(cfg.num_settle_steps >= 0, "num_settle_steps", f"must be >= 0, got {cfg.num_settle_steps}",
            "use 0 (no settling) or more")
    require(cfg.max_steps is None or cfg.max_steps >= 1, "max_steps", f"must be >= 1, got {cfg.max_steps}",
            "give the number of recorded steps per episode, or leave it unset for the suite's cap")
    require(cfg.num_envs >= 1, "num_envs", f"must be >= 1, got {cfg.num_envs}",
            "give the number of simulator processes to run in parallel (1 per free core)")
    require(cfg.writer_procs >= 1, "writer_procs", f"must be >= 1, got {cfg.writer_procs}",
            "give the number of processes that write finished episodes (about 1 per 4 free cores)")
    require(cfg.policy.noise_std >= 0, "policy.noise_std", f"must be >= 0, got {cfg.policy.noise_std}",
            "use 0 (the scripted commands as they are) or a positive standard deviation")
    require(cfg.policy.noise_period >= 1, "policy.noise_period", f"must be >= 1, got {cfg.policy.noise_period}",
            "use 1 (noise on every command) or the number of commands from one burst's start to the next")
    require(1 <= cfg.policy.noise_burst <= cfg.policy.noise_period, "policy.noise_burst",
            f"must be in 1..noise_period ({cfg.policy.noise_period}), got {cfg.policy.noise_burst}",
            "give how many commands of each period get the noise")
    require(cfg.policy.place_jitter >= 0, "policy.place_jitter", f"must be >= 0, got {cfg.policy.place_jitter}",
            "use 0 (carry straight over the target) or a radius in metres, e.g. 0.03")
    require(cfg.policy.approach_jitter >= 0, "policy.approach_jitter",
            f"must be >= 0, got {cfg.policy.approach_jitter}",
            "use 0 (descend straight onto the grasp) or a radius in metres, e.g. 0.02")
    require(cfg.repeats >= 1, "repeats", f"must be >= 1, got {cfg.repeats}",
            "give the number of episodes to record per task and init state")
    draws = cfg.policy.place_jitter > 0 or cfg.policy.approach_jitter > 0 or cfg.policy.noise_std > 0
    require(cfg.repeats == 1 or draws, "repeats",
            f"{cfg.repeats} episodes per init state would be identical: the scripted policy draws nothing",
            "add place or approach jitter or action noise (policy.place_jitter / policy.approach_jitter / "
            "policy.noise_std), or record once")
    require(cfg.recorded_action in RECORDED_ACTIONS, "recorded_action", f"unknown choice {cfg.recorded_action!r}",
            f"use one of {list(RECORDED_ACTIONS)} (executed: the command the simulator ran; clean: before "
            "the action noise)")
    require(cfg.camera_storage in camera_storages, "camera_storage", f"unknown storage {cfg.camera_storage!r}",
            f"use one of {list(camera_storages)}")
    out = Path(cfg.out)
    require(not out.exists() or (out.is_dir() and not any(out.iterdir())), "out",
            f"'{out}' exists and is {'not empty' if out.is_dir() else 'a file'} (it may hold another recording)",
            "choose a new output directory, or remove this one if it is not needed")
    try:
        require_simulator_python()
    except FileNotFoundError as err:
        raise ConfigError(SIMULATOR_FIELD, str(err).split(";")[0] + " (the LIBERO environment is not installed)",
                          "run requirements/install.sh (it builds .venv-libero), or point RLINF_COSMOS3_LIBERO_PYTHON "
                          "at the simulator environment's python") from err
