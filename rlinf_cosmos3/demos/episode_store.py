"""Where a recording keeps its finished episodes until the dataset is complete: atomic, resumable, parallel.

A recording into ``out`` works in ``<out>.partial/`` and never writes ``out`` itself until the end:

- ``plan.json``: the settings that decide what is recorded (a later run continues only with the same ones);
- ``episodes/<task>-<init>-<repeat>/``: a complete one-episode LeRobot v3 dataset of each kept episode,
  written under a temporary name by a writer process and renamed when lerobot has finalized it;
- ``episodes/<task>-<init>-<repeat>.json``: the episode's outcome, written (tmp + rename) after its dataset:
  the commit point. An episode without it is re-recorded by the next run.

:meth:`EpisodeStore.publish` joins the kept episodes in job order (task, init state, repeat) with lerobot's
own ``aggregate_datasets`` into a temporary directory beside ``out`` and renames it to ``out``; only then is
``<out>.partial`` removed. So ``out`` exists only complete, a kill at any moment loses at most the episodes
being written, and running the same command again records only what is missing.

Writing an episode (PNG frames, the AV1 encode, lerobot's per-episode statistics) costs seconds; it runs in
writer processes, so the simulators never wait for it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.demos.lerobot_writer import DemoDatasetWriter, EpisodeRecord, add_episode_columns
from rlinf_cosmos3.demos.record_config import RecordConfig

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
PLAN_FILE = "plan.json"
EPISODES_DIR = "episodes"
# RecordConfig fields that do not change what is recorded: a continued run may set them differently.
_NOT_PLANNED = ("out", "num_envs", "writer_procs", "concatenate_videos")

Frame = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # main image, wrist image, state, command


def job_key(task_id: int, init_state_id: int, repeat: int) -> str:
    return f"{task_id:03d}-{init_state_id:03d}-{repeat:03d}"


def partial_dir(out: str | os.PathLike[str]) -> Path:
    """The working directory of a recording into ``out``."""
    out = Path(out)
    return out.with_name(out.name + PARTIAL_SUFFIX)


def plan_of(cfg: RecordConfig) -> dict[str, Any]:
    """The settings that decide the recorded episodes, as JSON values."""
    plan = {k: v for k, v in asdict(cfg).items() if k not in _NOT_PLANNED}
    return json.loads(json.dumps(plan, default=str))


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def write_episode(root: str, repo_id: str, fps: int, image_size: int, use_videos: bool, frames: Sequence[Frame],
                  task: str, record: dict[str, Any]) -> str:
    """Write one kept episode as a one-episode dataset at ``root`` (a writer process runs this).

    The dataset is built under a temporary name and renamed to ``root`` only once lerobot has finalized it
    and its outcome columns are in, so ``root`` is never half-written."""
    final = Path(root)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a killed writer
    writer = DemoDatasetWriter(tmp, repo_id, fps=fps, image_size=image_size, use_videos=use_videos)
    for main, wrist, state, command in frames:
        writer.add_frame(main, wrist, state, command, task)
    writer.save_episode(EpisodeRecord(**record))
    writer.finalize()
    os.replace(tmp, final)
    return str(final)


@dataclass
class StoredOutcome:
    """What the store knows of a finished job (its ``.json`` file)."""

    key: str
    result: dict[str, Any]  # RecordedEpisodeResult fields
    kept: bool


class EpisodeStore:
    """The ``<out>.partial`` directory of one recording: finished jobs, writer processes, publishing."""

    def __init__(self, cfg: RecordConfig, writer_procs: int = 1) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.dir = partial_dir(cfg.out)
        self.episodes = self.dir / EPISODES_DIR
        self.writer_procs = max(1, writer_procs)
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[str, tuple[Future, dict[str, Any]]] = {}
        self.write_wait_s = 0.0  # time the recorder waited for a writer (backpressure)

    # ------------------------------------------------------------------ open / resume
    def open(self) -> dict[str, StoredOutcome]:
        """Create the directory, or check that the one there is this recording's; returns finished jobs."""
        plan = plan_of(self.cfg)
        plan_path = self.dir / PLAN_FILE
        if plan_path.exists():
            old = json.loads(plan_path.read_text())
            diff = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
            if diff:
                raise ConfigError("out", f"'{self.dir}' holds an interrupted recording with other settings "
                                         f"({', '.join(diff)} differ)",
                                  "run the same command as before to continue it, or delete that directory to "
                                  "start over")
        else:
            self.episodes.mkdir(parents=True, exist_ok=True)
            _write_json(plan_path, plan)
        done = {}
        for path in sorted(self.episodes.glob("*.json")):
            outcome = json.loads(path.read_text())
            key = path.stem
            kept = bool(outcome.get("kept"))
            if kept and not (self.episodes / key / "meta" / "info.json").exists():
                continue  # cannot happen with the write order; re-record rather than trust it
            done[key] = StoredOutcome(key, outcome, kept)
        return done

    # ------------------------------------------------------------------ writing
    def start(self) -> None:
        """Start the writer processes now, so that their imports overlap the simulators' start."""
        for _ in range(self.writer_procs):
            self._executor().submit(_warm_up)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:  # spawn: a fork would copy the simulator pipes and this process's threads
            self._pool = ProcessPoolExecutor(self.writer_procs, mp_context=get_context("spawn"))
        return self._pool

    def submit(self, key: str, frames: Sequence[Frame], task: str, record: EpisodeRecord,
               result: dict[str, Any]) -> None:
        """Write a kept episode in a writer process; its outcome file follows when it is on disk."""
        while len(self._pending) >= 2 * self.writer_procs:  # bound the frames held in memory
            t0 = time.monotonic()
            self._reap(block=True)
            self.write_wait_s += time.monotonic() - t0
        cfg = self.cfg
        future = self._executor().submit(write_episode, str(self.episodes / key), cfg.repo_id, cfg.fps,
                                         cfg.image_size, cfg.camera_storage == "video", list(frames), task,
                                         vars(record))
        self._pending[key] = (future, result)
        self._reap(block=False)

    def record_dropped(self, key: str, result: dict[str, Any]) -> None:
        """A finished job with nothing to keep (a failure, or a task the policy cannot do)."""
        _write_json(self.episodes / f"{key}.json", {**result, "kept": False})

    def _reap(self, block: bool) -> None:
        for key, (future, result) in list(self._pending.items()):
            if not (block or future.done()):
                continue
            future.result()  # a writer's error stops the recording here
            _write_json(self.episodes / f"{key}.json", {**result, "kept": True})
            del self._pending[key]
            block = False  # one is enough to make room

    def drain(self) -> None:
        """Wait for every episode being written."""
        while self._pending:
            self._reap(block=True)

    def close(self) -> None:
        """Stop the writer processes; an episode still being written is lost (re-recorded next time)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    # ------------------------------------------------------------------ publishing
    def publish(self, kept_keys: Iterable[str], outcomes: dict[str, dict[str, Any]]) -> dict[str, int]:
        """Join the kept episodes (in the order given) into ``out``; returns key -> episode index.

        Runs in a writer process (lerobot is imported there already). The joined dataset is built in a
        temporary directory beside ``out`` and renamed to it; the partial directory is removed afterwards."""
        keys = list(kept_keys)
        columns = {i: _episode_columns(outcomes[k], self.cfg) for i, k in enumerate(keys)}
        cfg = self.cfg
        self._executor().submit(publish_dataset, [str(self.episodes / k) for k in keys], columns, str(self.out),
                                cfg.repo_id, cfg.fps, cfg.image_size, cfg.camera_storage == "video",
                                str(self.dir), cfg.concatenate_videos).result()
        return {k: i for i, k in enumerate(keys)}


def publish_dataset(roots: Sequence[str], columns: dict[int, dict[str, Any]], out: str, repo_id: str, fps: int,
                    image_size: int, use_videos: bool, partial: str, concatenate_videos: bool = False) -> None:
    """Join one-episode datasets (in order) into ``out`` with lerobot's ``aggregate_datasets``, atomically
    (``concatenate_videos``: see :attr:`RecordConfig.concatenate_videos`).

    Built under a temporary name beside ``out``, given the outcome columns, then renamed to ``out``; the
    ``partial`` directory goes right after, in the same process, so a kill of the recorder cannot leave
    both."""
    from lerobot.datasets.aggregate import aggregate_datasets

    from rlinf_cosmos3.procgroup import keep_scheduling

    final = Path(out)
    tmp = final.with_name(f".{final.name}.publishing")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while publishing
    if roots:
        with keep_scheduling():
            aggregate_datasets([repo_id] * len(roots), repo_id, roots=[Path(r) for r in roots], aggr_root=tmp,
                               concatenate_videos=concatenate_videos)
        add_episode_columns(tmp, columns)
    else:  # nothing kept: an empty dataset that says so (0 episodes), as lerobot writes one
        DemoDatasetWriter(tmp, repo_id, fps=fps, image_size=image_size, use_videos=use_videos).finalize()
    if final.exists():  # an empty directory the user made (check_record_config allows only that)
        final.rmdir()
    os.replace(tmp, final)
    shutil.rmtree(partial)


def _warm_up() -> None:
    """Import lerobot in a writer process while the simulators start (it takes seconds)."""
    import lerobot.datasets.aggregate  # noqa: F401
    import lerobot.datasets.lerobot_dataset  # noqa: F401


def _episode_columns(result: dict[str, Any], cfg: RecordConfig) -> dict[str, Any]:
    """The meta/episodes outcome columns of a kept episode, from its stored result."""
    return vars(EpisodeRecord(success=result["success"], success_once=result["success_once"], suite=cfg.suite,
                              task_id=result["task_id"], init_state_id=result["init_state_id"],
                              num_settle_steps=cfg.num_settle_steps, repeat=result.get("repeat", 0)))
