"""Shared fixtures.

``recorded_libero_dataset``: a small real LeRobot v3.0 dataset recorded once per test session with
the real LIBERO simulator and the scripted policy (libero_spatial task 0, init states 0 and 1, two
simulator processes in parallel; failed episodes are kept so the layout never depends on the
policy). Modules that read demonstrations (data reader, SFT) use it instead of recording their own.

``adapter_model_dir``: the parts of a Cosmos3 model directory the eval config and the action adapter
read (model_index.json and the real tiny tokenizer), without weights.

``tiny_model_and_stats``: a real tiny Cosmos3 diffusers directory (seed 0) and an action-stats file
computed at 20 fps on one random 40-step episode: what config validation needs when the numbers do
not matter. Shared read-only; a test that needs other files writes them next to its own tmp_path.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class RecordedDataset:
    """Where the session's recorded dataset lives and how it was recorded."""

    root: Path
    repo_id: str
    suite: str
    task_ids: tuple[int, ...]
    init_state_ids: tuple[int, ...]
    fps: int
    results: tuple  # rlinf_cosmos3.demos.recorder.RecordedEpisodeResult, one per attempted episode


@pytest.fixture(scope="session")
def adapter_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model_index.json and the real tiny tokenizer: what the eval config and the adapter read."""
    import json

    from rlinf_cosmos3.models.cosmos3.tiny import build_tokenizer

    root = tmp_path_factory.mktemp("adapter_model")
    build_tokenizer().save_pretrained(root / "text_tokenizer")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "Cosmos3OmniPipeline"}))
    return root


@dataclass(frozen=True)
class TinyModelAndStats:
    """A tiny random Cosmos3 model directory and a stats file (with the stats document it holds)."""

    model: Path
    stats: Path
    stats_doc: dict


@pytest.fixture(scope="session")
def tiny_model_and_stats(tmp_path_factory: pytest.TempPathFactory) -> TinyModelAndStats:
    """A tiny model (seed 0) and stats of one random 40-step episode at 20 fps; read-only."""
    import numpy as np

    from rlinf_cosmos3.actions import compute_action_stats, write_action_stats
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

    root = tmp_path_factory.mktemp("tiny_model_and_stats")
    rng = np.random.default_rng(0)
    episodes = [np.concatenate([rng.uniform(-1, 1, (40, 6)), rng.uniform(0, 1, (40, 1))], axis=1)]
    stats = compute_action_stats(episodes, metadata={"fps": 20})
    return TinyModelAndStats(model=write_model_dir(root / "model", preset="tiny", seed=0),
                             stats=write_action_stats(stats, root / "stats.json"), stats_doc=stats)


@pytest.fixture(scope="session")
def recorded_libero_dataset(tmp_path_factory: pytest.TempPathFactory) -> RecordedDataset:
    """Record 2 scripted libero_spatial episodes (~80 frames each, 256x256, 20 fps) once per session."""
    from rlinf_cosmos3.demos.recorder import RecordConfig, record_demos

    cfg = RecordConfig(
        suite="libero_spatial",
        task_ids=[0],
        init_state_ids=[0, 1],
        out=tmp_path_factory.mktemp("recorded_libero") / "dataset",
        repo_id="local/recorded_libero",
        keep_failed=True,
        num_envs=2,
    )
    results = record_demos(cfg, show_progress=False)
    return RecordedDataset(root=cfg.out, repo_id=cfg.repo_id, suite=cfg.suite, task_ids=tuple(cfg.task_ids),
                           init_state_ids=tuple(cfg.init_state_ids), fps=cfg.fps, results=tuple(results))


@pytest.fixture(scope="session")
def short_libero_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real libero_spatial episodes (init states 0 and 1) cut at 20 frames, repo id ``local/short``: small
    enough for VAE work on CPU, two episodes for what is shared by episode."""
    from dataset_helpers import SHORT_FRAMES

    from rlinf_cosmos3.demos.recorder import RecordConfig, record_demos

    cfg = RecordConfig(suite="libero_spatial", task_ids=[0], init_state_ids=[0, 1],
                       out=tmp_path_factory.mktemp("short_libero") / "dataset", repo_id="local/short",
                       max_steps=SHORT_FRAMES, keep_failed=True, num_envs=2)
    record_demos(cfg, show_progress=False)
    return cfg.out


# This process's CPU scheduling when the session started. SVT-AV1 (lerobot's video encoder) run as root
# switches the thread that encodes to SCHED_FIFO 99; were that the pytest process, every later thread and
# child (torch's OpenMP pool, Ray, simulators, servers) would be real-time too, and spinning real-time
# threads on a two-core machine stall the suite for good (the signal-based timeout cannot fire).
_SESSION_SCHEDULING = (os.sched_getscheduler(0), os.sched_getparam(0))


def _scheduling_changed(when: str) -> str | None:
    now = (os.sched_getscheduler(0), os.sched_getparam(0))
    if now == _SESSION_SCHEDULING:
        return None
    os.sched_setscheduler(0, _SESSION_SCHEDULING[0], _SESSION_SCHEDULING[1])
    return (f"{when}, this process's scheduling policy was {now[0]} priority {now[1].sched_priority} instead of "
            f"{_SESSION_SCHEDULING[0]} priority {_SESSION_SCHEDULING[1].sched_priority} (restored): wrap lerobot's "
            "save_episode/finalize in rlinf_cosmos3.procgroup.keep_scheduling()")


@pytest.fixture(autouse=True)
def _process_stays_on_normal_scheduling():
    """Fail the test (or the fixture before it) that left this process real-time, and put it back."""
    if problem := _scheduling_changed("before this test (a fixture it uses wrote videos)"):
        pytest.fail(problem, pytrace=False)
    yield
    if problem := _scheduling_changed("after this test"):
        pytest.fail(problem, pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Keep Python's fault handler on through interpreter shutdown (pytest's own turns it off here).

    This process starts and stops Ray, gloo and video encoders in-process; should native code crash
    while the interpreter finalises, after every test has reported, the run's exit status is the only
    trace. With the handler on, the crash prints every thread's Python stack to stderr instead."""
    faulthandler.enable(file=sys.__stderr__, all_threads=True)

