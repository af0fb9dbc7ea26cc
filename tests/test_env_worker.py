"""The LIBERO env worker as a real Ray actor driving real LIBERO simulator processes.

Kept cheap for 2 cores: libero_spatial, a 32-step cap (10 settle + 22 policy steps, i.e. two
chunk steps of 16 and 6 actions), at most 2 simulators at a time. Every test checks that the
simulator processes it saw are gone at the end; only our own pids are checked, since other
simulators may run on the same machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray

from rlinf_cosmos3.cluster import Cluster, ClusterConfig, WorkerError, WorkerGroup
from rlinf_cosmos3.config.env import EnvEvalConfig
from rlinf_cosmos3.config.libero_suites import NOOP_ACTION, NUM_SETTLE_STEPS
from rlinf_cosmos3.demos.scripted_policy import ScriptedPickPlace
from rlinf_cosmos3.sim.client import LiberoSimProcess
from rlinf_cosmos3.sim.object_lift import lift_label
from rlinf_cosmos3.workers.env.episodes import Episode
from rlinf_cosmos3.workers.env.libero_env_worker import LiberoEnvWorker, start_env_workers
from rlinf_cosmos3.workers.env.results import EpisodeResult, episode_log_line
from rlinf_cosmos3.workers.env.slot import EnvSlot
from rlinf_cosmos3.workers.env.stage import EnvStage, StageOutput
from rlinf_cosmos3.workers.env.video import EpisodeVideoWriter
from rlinf_cosmos3.workers.observation_keys import (
    ATTEMPTS,
    EPISODE_STEPS,
    MAIN_IMAGES,
    SLOT_IDS,
    STATES,
    TASK_DESCRIPTIONS,
    TASK_IDS,
    TRIAL_IDS,
    WRIST_IMAGES,
)

pytestmark = pytest.mark.libero

CAP = 32
CALL_TIMEOUT_S = 600
NOOP = np.asarray(NOOP_ACTION, dtype=np.float64)
# LIBERO's task.language of libero_spatial tasks 0..2 (the prompts of both reference evaluations)
SPATIAL_PROMPTS = {
    0: "pick up the black bowl between the plate and the ramekin and place it on the plate",
    1: "pick up the black bowl next to the ramekin and place it on the plate",
    2: "pick up the black bowl from table center and place it on the plate",
}


def _noop_chunk(n: int, k: int = 16) -> np.ndarray:
    return np.tile(NOOP, (n, k, 1))


def _live_in_group(pgid: int) -> list[int]:
    """Non-zombie processes of process group ``pgid`` (a simulator and anything it spawned)."""
    live = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                live.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return live


def _wait_all_gone(pgids: set[int], timeout_s: float = 20.0) -> dict[int, list[int]]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = {g: live for g in pgids if (live := _live_in_group(g))}
        if not left or time.monotonic() > deadline:
            return left


def _is_simulator(pid: int) -> bool:
    return "rlinf_cosmos3.sim.libero_server" in " ".join(psutil.Process(pid).cmdline())


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp_dir = Path(f"/tmp/re{os.getpid()}")
    c = Cluster(ClusterConfig(num_cpus=2, object_store_memory_mb=100, temp_dir=str(temp_dir)))
    try:
        yield c
    finally:
        c.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@contextmanager
def env_group(cluster: Cluster, cfg: EnvEvalConfig, stages: int = 1) -> Iterator[WorkerGroup]:
    group = start_env_workers(cluster, cfg, stages, cpus_per_rank=0.5, name="libero-env")
    try:
        yield group
    finally:
        if group.actors:  # not shut down by the test itself
            try:
                group.call("close", timeout_s=120)
            except WorkerError:
                pass  # a dead rank's simulators exit on EOF of their pipes
        group.shutdown()


def _call(group: WorkerGroup, method: str, *args: object) -> object:
    return group.call_rank(0, method, *args, timeout_s=CALL_TIMEOUT_S)


def _step(group: WorkerGroup, stage: int, obs: dict) -> StageOutput:
    return _call(group, "chunk_step", stage, _noop_chunk(len(obs[SLOT_IDS])), obs[SLOT_IDS])


def _slot_pid(group: WorkerGroup, slot_id: int) -> int:
    pid = next(s["pid"] for s in _call(group, "stats") if s["slot_id"] == slot_id)
    assert pid is not None, f"slot {slot_id} has no live simulator"
    return pid


def _wait_phases(group: WorkerGroup, want: dict[int, str], timeout_s: float = 120.0) -> None:
    """Poll ``stats`` until each slot in ``want`` is in the given phase (a control call: it is
    answered by the actor's spare thread while stage calls are in flight)."""
    deadline = time.monotonic() + timeout_s
    while True:
        phases = {s["slot_id"]: s["phase"] for s in group.call_rank(0, "stats", timeout_s=60)}
        if all(phases[slot] == phase for slot, phase in want.items()):
            return
        assert time.monotonic() < deadline, f"slots never reached {want}: {phases}"
        time.sleep(0.2)


def _decode(path: str) -> list[np.ndarray]:
    import av

    with av.open(path) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]


# ------------------------------------------------------------------------------------------ no simulator
def test_log_line_is_the_reference_format() -> None:
    result = EpisodeResult("libero_goal", 3, 17, True, False, 120)
    assert episode_log_line(result) == "[libero eval] task_id=3, trial_id=17, success=True"
    failed = EpisodeResult("libero_goal", 3, 18, False, False, 0, error="SimProcessError on each of 3 attempt(s)")
    assert episode_log_line(failed) == \
        "[libero eval] task_id=3, trial_id=18, success=False, error=SimProcessError on each of 3 attempt(s)"
    assert result.to_dict()["error"] is None and result.to_dict()["steps"] == 120


def test_video_writer_streams_and_renames_only_when_finished(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    main = rng.integers(0, 255, (5, 64, 64, 3), dtype=np.uint8)
    wrist = np.zeros_like(main)
    writer = EpisodeVideoWriter(tmp_path / "ep.mp4", fps=20)
    writer.add(main[:3], wrist[:3])
    writer.add(main[3:], wrist[3:])
    assert not (tmp_path / "ep.mp4").exists(), "an unfinished video must not look finished"
    final = writer.finish(tmp_path / "ep_success.mp4")
    frames = _decode(str(final))
    assert len(frames) == 5 and frames[0].shape == (64, 128, 3)
    assert frames[0][:, 64:].mean() < 10 < frames[0][:, :64].mean()  # wrist (black) on the right
    dropped = EpisodeVideoWriter(tmp_path / "crashed.mp4", fps=20)
    dropped.add(main, wrist)
    dropped.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep_success.mp4"]


# ------------------------------------------------------------------------------------------ real workers
def test_episodes_run_to_the_cap_auto_reset_and_write_videos(cluster: Cluster, tmp_path: Path) -> None:
    """1 stage x 2 slots, 3 episodes dealt round-robin: slot 0 runs (task 0, trial 0) then (task 2,
    trial 0) -- a new task, so a re-make; slot 1 runs (task 1, trial 0) and then idles (padding)."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0, 1, 2], trials_per_task=1, total_num_envs=2,
                        max_episode_steps=CAP, save_video=True, video_dir=str(tmp_path / "videos"), video_fps=10)
    pgids: set[int] = set()
    with env_group(cluster, cfg) as group:
        info = _call(group, "setup")
        assert info == {"rank": 0, "stages": 1, "slots": 2, "busy_slots": 2, "episodes": 3}
        pids = _call(group, "sim_process_ids")
        pgids.update(pids)
        assert len(pids) == 2 and all(_is_simulator(p) for p in pids)

        out = _call(group, "observe", 0)
        obs = out.obs
        assert out.results == [] and not out.done
        assert obs[SLOT_IDS].tolist() == [0, 1]
        assert obs[TASK_IDS].tolist() == [0, 1] and obs[TRIAL_IDS].tolist() == [0, 0]
        assert obs[TASK_DESCRIPTIONS] == [SPATIAL_PROMPTS[0], SPATIAL_PROMPTS[1]]
        for key in (MAIN_IMAGES, WRIST_IMAGES):
            assert obs[key].shape == (2, 256, 256, 3) and obs[key].dtype == np.uint8
            assert obs[key].std() > 10, f"{key} looks blank"
        assert not np.array_equal(obs[MAIN_IMAGES], obs[WRIST_IMAGES])
        assert obs[STATES].shape == (2, 8) and obs[STATES].dtype == np.float32
        # after the settle no-ops (gripper commanded open) the Panda fingers are open
        assert (obs[STATES][:, 6] > 0.03).all() and (obs[STATES][:, 7] < -0.03).all()

        out = _step(group, 0, obs)  # steps 10 -> 26
        assert out.results == [] and out.obs[SLOT_IDS].tolist() == [0, 1]
        out = _step(group, 0, out.obs)  # only 6 of the 16 actions fit under the cap
        results = sorted(out.results, key=lambda r: r.task_id)
        assert [(r.task_id, r.trial_id) for r in results] == [(0, 0), (1, 0)]
        for r in results:
            assert (r.suite, r.steps, r.success_once, r.success_at_end, r.error, r.attempts) == \
                ("libero_spatial", CAP, False, False, None, 1)
            assert r.task_description == SPATIAL_PROMPTS[r.task_id]
        assert [r.slot_id for r in results] == [0, 1]
        # auto-reset: slot 0 shows its next episode, slot 1 has none left and idles
        assert out.obs[SLOT_IDS].tolist() == [0] and out.obs[TASK_IDS].tolist() == [2]
        assert out.obs[TASK_DESCRIPTIONS] == [SPATIAL_PROMPTS[2]]
        assert out.obs[MAIN_IMAGES].shape == (1, 256, 256, 3) and not out.done
        assert len(_call(group, "sim_process_ids")) == 1, "the idle slot's simulator should be closed"
        assert not _call(group, "done")

        out = _step(group, 0, out.obs)
        assert out.results == []
        out = _step(group, 0, out.obs)
        assert [(r.task_id, r.trial_id, r.steps, r.error) for r in out.results] == [(2, 0, CAP, None)]
        results.extend(out.results)
        assert out.done and out.obs[SLOT_IDS].tolist() == [] and out.obs[MAIN_IMAGES].shape == (0, 256, 256, 3)
        assert _call(group, "done")

        stats = {s["slot_id"]: s for s in _call(group, "stats")}
        assert (stats[0]["makes"], stats[0]["process_starts"], stats[0]["reported"]) == (2, 1, 2)
        assert (stats[1]["makes"], stats[1]["process_starts"], stats[1]["reported"]) == (1, 1, 1)
        _call(group, "close")
        assert not _wait_all_gone(pgids), "simulator processes left after close()"

    for r in results:  # one decodable mp4 per episode, main | wrist, at 10 fps: a frame every second step
        assert r.video_path is not None and r.video_path.endswith(f"task{r.task_id:02d}_trial00_failure.mp4")
        frames = _decode(r.video_path)
        assert r.steps == CAP and len(frames) == CAP // 2
        assert frames[0].shape == (256, 512, 3)
    assert not list((tmp_path / "videos").rglob("*.partial"))


def test_killed_simulator_reruns_the_episode_from_its_start(cluster: Cluster) -> None:
    """2 stages x 1 slot, task 0 trials 0..2: stage 0 runs trials 0, 2 (one env build for both),
    stage 1 runs trial 1, whose simulator is SIGKILLed during a chunk step 26 steps in: the episode
    is re-run from its start on a new process and reported once, complete. Three results in total."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=3, total_num_envs=2,
                        max_episode_steps=CAP, max_episode_retries=1)
    pgids: set[int] = set()
    results: list[EpisodeResult] = []
    with env_group(cluster, cfg, stages=2) as group:
        _call(group, "setup")
        out0 = _call(group, "observe", 0)
        out1 = _call(group, "observe", 1)
        assert out0.obs[TRIAL_IDS].tolist() == [0] and out1.obs[TRIAL_IDS].tolist() == [1]
        assert out1.obs[ATTEMPTS].tolist() == [1]
        out1 = _step(group, 1, out1.obs)  # trial 1 is 26 steps in
        victim = _slot_pid(group, 1)
        pgids.add(victim)
        # Freeze the simulator first so the chunk step cannot finish before the kill lands
        # (6 steps take well under a second on an idle machine): the crash is always mid-step.
        os.kill(victim, signal.SIGSTOP)
        ref = group.call_async("chunk_step", 1, _noop_chunk(1), out1.obs[SLOT_IDS], ranks=[0])
        time.sleep(1.0)
        os.kill(victim, signal.SIGKILL)
        out1 = group.gather(ref, [0], method="chunk_step", timeout_s=CALL_TIMEOUT_S)[0]
        assert out1.results == [], "a crashed episode must be re-run, not reported"
        assert out1.obs[TRIAL_IDS].tolist() == [1] and out1.obs[SLOT_IDS].tolist() == [1]
        assert out1.obs[ATTEMPTS].tolist() == [2]  # RL drops the first attempt's decisions by this
        replacement = _slot_pid(group, 1)
        pgids.add(replacement)
        assert replacement != victim and _is_simulator(replacement)
        out1 = _step(group, 1, out1.obs)
        assert out1.results == [], "the re-run starts from step 0, so it needs both chunks again"
        out1 = _step(group, 1, out1.obs)
        assert [(r.trial_id, r.steps, r.error, r.attempts) for r in out1.results] == [(1, CAP, None, 2)]
        assert out1.done
        results += out1.results

        while not out0.done:
            out0 = _step(group, 0, out0.obs)
            results += out0.results
        assert _call(group, "done")
        stats = {s["slot_id"]: s for s in _call(group, "stats")}
        assert stats[0]["makes"] == 1, "two episodes of the same task must share one env build"
        assert (stats[1]["process_starts"], stats[1]["makes"]) == (2, 2)
        _call(group, "close")
    assert sorted((r.task_id, r.trial_id, r.error) for r in results) == [(0, 0, None), (0, 1, None), (0, 2, None)]
    assert not _wait_all_gone(pgids), "simulator processes left behind"


def test_assign_reuses_kept_simulators_for_the_next_set_of_episodes(cluster: Cluster) -> None:
    """RL's rounds: a worker started without episodes and ``keep_processes`` takes a set with ``assign``, runs it,
    and takes the next set on the same simulator processes (the task built once); an assign while a set still runs
    is refused without harming the worker."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], total_num_envs=2, max_episode_steps=CAP)
    group = start_env_workers(cluster, cfg, 1, cpus_per_rank=0.5, name="libero-env-rl", episodes=[],
                              keep_processes=True)
    try:
        assert _call(group, "setup")["busy_slots"] == 0
        pids: list[set[int]] = []
        for trial in (0, 1):
            assert _call(group, "assign", [Episode(0, trial, "libero_spatial")] * 2) == 2
            out = _call(group, "observe", 0)
            assert out.obs[TRIAL_IDS].tolist() == [trial, trial] and out.obs[ATTEMPTS].tolist() == [1, 1]
            with pytest.raises(WorkerError, match="still running"):
                group.call_rank(0, "assign", [Episode(0, 2, "libero_spatial")] * 2, timeout_s=CALL_TIMEOUT_S)
            results: list[EpisodeResult] = []
            while not out.done:
                out = _step(group, 0, out.obs)
                results += out.results
            assert sorted((r.trial_id, r.steps, r.error) for r in results) == [(trial, CAP, None)] * 2
            stats = _call(group, "stats")
            assert all(s["phase"] == "idle" and s["pid"] is not None for s in stats)  # kept alive
            pids.append({s["pid"] for s in stats})
        assert pids[0] == pids[1] and len(pids[0]) == 2
        assert all((s["makes"], s["process_starts"]) == (1, 1) for s in _call(group, "stats"))
        _call(group, "close")
        assert not _wait_all_gone(pids[0])
    finally:
        group.shutdown()


def test_two_stages_of_one_worker_step_at_the_same_time(cluster: Cluster) -> None:
    """2 stages x 1 slot on ONE worker. Both simulators are frozen (SIGSTOP) and both stages' chunk
    steps issued at once: both calls get inside the worker (their slots show phase ``step``) while
    neither can finish, and a control call is still answered -- a sequential actor would run the
    second chunk step only after the first returned. After SIGCONT both finish; the calls' start/end
    times (taken in the worker) overlap. The episodes end as with one stage at a time."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=2, total_num_envs=2,
                        max_episode_steps=CAP)
    pgids: set[int] = set()
    results: list[EpisodeResult] = []
    with env_group(cluster, cfg, stages=2) as group:
        _call(group, "setup")
        refs = [group.call_async("observe", s, ranks=[0])[0] for s in (0, 1)]
        outs = group.gather(refs, [0, 0], method="observe", timeout_s=CALL_TIMEOUT_S)
        assert [o.obs[SLOT_IDS].tolist() for o in outs] == [[0], [1]]
        assert [o.obs[TRIAL_IDS].tolist() for o in outs] == [[0], [1]]
        pids = [_slot_pid(group, 0), _slot_pid(group, 1)]
        pgids.update(pids)

        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            refs = [group.call_async("chunk_step", s, _noop_chunk(1), outs[s].obs[SLOT_IDS], ranks=[0])[0]
                    for s in (0, 1)]
            _wait_phases(group, {0: "step", 1: "step"})  # both stages are inside chunk_step at once
            assert _call(group, "done") is False
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        outs = group.gather(refs, [0, 0], method="chunk_step", timeout_s=CALL_TIMEOUT_S)
        assert max(o.started_s for o in outs) < min(o.finished_s for o in outs), \
            [(o.started_s, o.finished_s) for o in outs]
        assert all(o.results == [] for o in outs)

        refs = [group.call_async("chunk_step", s, _noop_chunk(1), outs[s].obs[SLOT_IDS], ranks=[0])[0]
                for s in (0, 1)]
        outs = group.gather(refs, [0, 0], method="chunk_step", timeout_s=CALL_TIMEOUT_S)
        for out in outs:
            assert out.done and out.obs[SLOT_IDS].tolist() == []
            results += out.results
        assert _call(group, "done")
        _call(group, "close")
    assert sorted((r.trial_id, r.steps, r.error) for r in results) == [(0, CAP, None), (1, CAP, None)]
    assert not _wait_all_gone(pgids), "simulator processes left behind"


def test_failure_in_one_stage_stops_the_other_stage_once_its_call_returns(cluster: Cluster) -> None:
    """Stage 1 is mid chunk step (its simulator frozen) when stage 0 gets NaN actions: stage 0's
    simulator is killed at once, the error waits for stage 1's call to return (its pipes are not
    pulled from under it), then stage 1's simulator is killed too and the error reaches the caller.
    Every later call is refused."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=2, total_num_envs=2,
                        max_episode_steps=CAP)
    with env_group(cluster, cfg, stages=2) as group:
        _call(group, "setup")
        outs = [_call(group, "observe", s) for s in (0, 1)]
        pid0, pid1 = _slot_pid(group, 0), _slot_pid(group, 1)
        os.kill(pid1, signal.SIGSTOP)
        try:
            busy = group.call_async("chunk_step", 1, _noop_chunk(1), outs[1].obs[SLOT_IDS], ranks=[0])
            _wait_phases(group, {1: "step"})
            bad = _noop_chunk(1)
            bad[0, 0, 0] = np.nan
            failing = group.call_async("chunk_step", 0, bad, outs[0].obs[SLOT_IDS], ranks=[0])
            assert not _wait_all_gone({pid0}), "the failing stage's simulator should be killed at once"
            done, _ = ray.wait(failing, timeout=1.0)
            assert not done, "the error must wait until the busy stage can be stopped"
        finally:
            os.kill(pid1, signal.SIGCONT)
        out1 = group.gather(busy, [0], method="chunk_step", timeout_s=CALL_TIMEOUT_S)[0]
        assert out1.obs[SLOT_IDS].tolist() == [1], "the busy stage's call completes normally"
        with pytest.raises(WorkerError, match="non-finite actions for slots \\[0\\]"):
            group.gather(failing, [0], method="chunk_step", timeout_s=CALL_TIMEOUT_S)
        assert not _wait_all_gone({pid0, pid1}), "simulator left after an exception"
        with pytest.raises(WorkerError, match="failed earlier"):
            _call(group, "chunk_step", 1, _noop_chunk(1), out1.obs[SLOT_IDS])


def test_retries_exhausted_error_then_exception_then_actor_death(cluster: Cluster) -> None:
    """No re-runs allowed: a killed simulator gets its episode reported once with an error and the
    slot goes on with its next episode on a fresh process. Then NaN actions raise out of the worker,
    which kills its simulators first; a killed actor takes its simulators with it."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=2, total_num_envs=1,
                        max_episode_steps=CAP, max_episode_retries=0)
    with env_group(cluster, cfg) as group:
        _call(group, "setup")
        out = _call(group, "observe", 0)
        first = _slot_pid(group, 0)
        os.kill(first, signal.SIGKILL)
        out = _step(group, 0, out.obs)
        (failed,) = out.results
        assert (failed.trial_id, failed.attempts, failed.success_once, failed.steps) == (0, 1, False, 0)
        assert failed.error is not None and "SimProcessError" in failed.error
        assert episode_log_line(failed).startswith("[libero eval] task_id=0, trial_id=0, success=False, error=")
        assert out.obs[TRIAL_IDS].tolist() == [1] and not out.done
        pgids = {first, _slot_pid(group, 0)}

        bad = _noop_chunk(1)
        bad[0, 3, 0] = np.nan
        with pytest.raises(WorkerError, match="non-finite actions for slots \\[0\\]"):
            _call(group, "chunk_step", 0, bad, out.obs[SLOT_IDS])
        assert not _wait_all_gone(pgids), "simulator left after an exception"
        with pytest.raises(WorkerError, match="failed earlier"):
            _call(group, "observe", 0)

    with env_group(cluster, cfg) as group:  # the actor process is killed outright
        _call(group, "setup")
        pgids = set(_call(group, "sim_process_ids"))
        assert len(pgids) == 1
        group.shutdown()
        assert not _wait_all_gone(pgids), "simulator outlived its killed env worker actor"


def test_slots_idling_in_one_chunk_step_close_their_simulators_concurrently(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage (no Ray) of 2 slots with one episode each, cap 26 (10 settle + one chunk of 16): both
    episodes end in the same chunk step. Both ``close`` requests are sent before the first close reply
    is awaited (one close round trip per call, not one per slot), and when the call returns both
    simulators are gone."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=2, total_num_envs=2,
                        max_episode_steps=26).validate(1)
    events: list[tuple[str, str, int]] = []
    send, recv = LiberoSimProcess.send, LiberoSimProcess.recv

    def recording_send(self: LiberoSimProcess, cmd: str, *args: object, **kwargs: object) -> None:
        events.append(("send", cmd, self.process_id))
        send(self, cmd, *args, **kwargs)

    def recording_recv(self: LiberoSimProcess, *args: object, **kwargs: object) -> dict:
        events.append(("recv", str(self._pending), self.process_id))
        return recv(self, *args, **kwargs)

    monkeypatch.setattr(LiberoSimProcess, "send", recording_send)
    monkeypatch.setattr(LiberoSimProcess, "recv", recording_recv)
    stage = EnvStage(0, [EnvSlot(i, [Episode(0, i)], cfg) for i in range(2)], cfg.image_size)
    try:
        stage.start_processes()
        pgids = {slot.process_id for slot in stage.slots}
        assert None not in pgids and len(pgids) == 2
        stage.run()
        assert [s.slot_id for s in stage.ready_slots()] == [0, 1]
        stage.step(_noop_chunk(2))
        out = stage.output()
        assert sorted((r.trial_id, r.steps, r.error) for r in out.results) == [(0, 26, None), (1, 26, None)]
        assert out.final_obs == []  # the eval's default: a truncated episode's last observation is not kept
        assert out.done and all(s.idle and s.proc is None and s.closing is None for s in stage.slots)
    finally:
        stage.kill()
    close_sends = [i for i, (what, cmd, _) in enumerate(events) if what == "send" and cmd == "close"]
    close_recvs = [i for i, (what, cmd, _) in enumerate(events) if what == "recv" and cmd == "close"]
    assert len(close_sends) == len(close_recvs) == 2, events
    assert max(close_sends) < min(close_recvs), f"closes were serialized: {events}"
    assert not _wait_all_gone(pgids), "simulator processes left after the last chunk step"


def test_open_loop_steps_runs_the_head_of_each_chunk(cluster: Cluster) -> None:
    """``open_loop_steps=6``: of each 16-command chunk only the first 6 run, so the policy is asked
    again after 6 steps and the 22 policy steps under the cap take 4 requests (6+6+6+4), not 2."""
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=1, total_num_envs=1,
                        max_episode_steps=CAP, open_loop_steps=6)
    with env_group(cluster, cfg) as group:
        out = _call(group, "observe", 0)
        seen = [int(out.obs[EPISODE_STEPS][0])]
        requests = 0
        while not out.results:
            out = _step(group, 0, out.obs)
            requests += 1
            if not out.results:
                seen.append(int(out.obs[EPISODE_STEPS][0]))
        assert seen == [0, 6, 12, 18]
        assert requests == 4 and out.results[0].steps == CAP
        _call(group, "close")


def test_worker_count_must_match_the_group(cluster: Cluster) -> None:
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=2, total_num_envs=2, num_workers=2)
    with pytest.raises(WorkerError, match="env.eval.num_workers"):
        WorkerGroup(LiberoEnvWorker, cluster, 1, kwargs={"cfg": cfg}, init_distributed=False, cpus_per_rank=0.5)


def test_a_truncated_episode_hands_out_the_observation_it_stopped_at() -> None:
    """``final_observations`` (RL's PPO): an episode that runs to the cap without success comes back with the
    observation after its last command, the one no decision was taken on. A stage (no Ray) of 2 slots, cap 26
    (10 settle + one chunk of 16): slot 0 moves the arm, slot 1 idles. Slot 0's final observation is what a bare
    simulator shows after the same commands, bit for bit, and differs from the one its decision was taken on.
    (Without the option nothing is handed out: the test of closing idle slots above.)"""
    move = np.tile(NOOP, (16, 1))
    move[:, 0] = 0.5  # +x for the whole chunk: the arm is elsewhere at the cap
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=2, total_num_envs=2,
                        max_episode_steps=26, final_observations=True).validate(1)
    stage = EnvStage(0, [EnvSlot(i, [Episode(0, i)], cfg) for i in range(2)], cfg.image_size)
    try:
        stage.start_processes()
        stage.run()
        decided = stage.output().obs
        stage.step(np.stack([move, np.tile(NOOP, (16, 1))]))
        out = stage.output()
    finally:
        stage.kill()
    assert sorted((r.trial_id, r.steps, r.success_once) for r in out.results) == [(0, 26, False), (1, 26, False)]
    finals = {f.slot_id: f for f in out.final_obs}
    assert sorted(finals) == [0, 1] and all(f.attempt == 1 for f in finals.values())
    assert all(f.prompt == SPATIAL_PROMPTS[0] for f in finals.values())
    assert all(f.main_image.shape == (256, 256, 3) and f.main_image.dtype == np.uint8 for f in finals.values())
    assert not np.array_equal(finals[0].main_image, decided[MAIN_IMAGES][0]), "the arm moved: a new view"
    assert all(slot.final_observations == [] for slot in stage.slots)  # handed out once
    with LiberoSimProcess(name="bare") as proc:
        proc.make("libero_spatial", 0, seed=0)
        proc.reset(0)
        proc.chunk_step(np.tile(NOOP, (NUM_SETTLE_STEPS, 1)))
        bare = proc.chunk_step(move)
    assert np.array_equal(bare["main_image"], finals[0].main_image)
    assert np.array_equal(bare["wrist_image"], finals[0].wrist_image)


def _scripted_solution() -> tuple[np.ndarray, int]:
    """Commands of the scripted pick-place policy that solve libero_spatial task 0 from init state 0
    (closed loop on privileged state in a bare simulator), padded with 16 no-ops, and the policy
    step of the first success."""
    with LiberoSimProcess(name="scripted") as proc:
        proc.make("libero_spatial", 0, seed=0)
        proc.reset(0)
        obs = proc.chunk_step(np.tile(NOOP, (10, 1)), privileged=True)
        policy = ScriptedPickPlace(obs["goal"])
        commands, first_success = [], None
        for t in range(200):
            command = policy.act(obs)
            commands.append(command)
            obs = proc.step(command, privileged=True)
            if obs["success"]:
                first_success = t
                break
    assert first_success is not None, "scripted policy did not solve libero_spatial task 0, init state 0"
    return np.concatenate([np.stack(commands), np.tile(NOOP, (16, 1))]), first_success


@pytest.mark.slow
def test_save_video_failures_keeps_only_the_failed_episodes_video(cluster: Cluster, tmp_path: Path) -> None:
    """Two envs side by side: trial 0 replays the scripted solution in 16-step chunks (a success: the
    episode ends exactly at its first successful step), trial 1 idles with no-ops to the cap (a failure).
    Both are recorded, only the failure's mp4 is written, only the failure hands out its final observation
    (``final_observations``); the simulators are gone after close. The
    results say how high each lifted the bowl (``object_lift_m``): the success carried it, the no-ops never did."""
    padded, first_success = _scripted_solution()
    succeeds_at = NUM_SETTLE_STEPS + first_success + 1
    cap = succeeds_at + 16  # the success ends its episode before the cap
    cfg = EnvEvalConfig(suite="libero_spatial", task_ids=[0], trials_per_task=2, total_num_envs=2,
                        max_episode_steps=cap, save_video="failures", video_dir=str(tmp_path / "videos"),
                        final_observations=True)
    results: list[EpisodeResult] = []
    finals: list = []
    with env_group(cluster, cfg) as group:
        _call(group, "setup")
        out = _call(group, "observe", 0)
        pgids = set(_call(group, "sim_process_ids"))
        done_at = 0
        while not out.done:
            chunk = [padded[done_at:done_at + 16] if trial == 0 else np.tile(NOOP, (16, 1))
                     for trial in out.obs[TRIAL_IDS].tolist()]
            out = _call(group, "chunk_step", 0, np.stack(chunk), out.obs[SLOT_IDS])
            results.extend(out.results)
            finals.extend(out.final_obs)
            done_at += 16
        _call(group, "close")
    by_trial = {r.trial_id: r for r in results}
    assert sorted(by_trial) == [0, 1] and all(r.error is None for r in results)
    assert (by_trial[0].success_once, by_trial[0].success_at_end, by_trial[0].steps) == (True, True, succeeds_at)
    assert by_trial[1].steps == cap and by_trial[0].video_path is None
    assert not by_trial[1].success_once and by_trial[1].video_path is not None
    assert by_trial[1].video_path.endswith("task00_trial01_failure.mp4")
    assert len(_decode(by_trial[1].video_path)) == cap
    # with final_observations (PPO's bootstrap) only the episode that ran to the cap hands out where it stopped
    assert [(f.slot_id, f.attempt) for f in finals] == [(by_trial[1].slot_id, 1)]
    assert [p.name for p in (tmp_path / "videos").rglob("*") if p.is_file()] == ["task00_trial01_failure.mp4"]
    assert not _wait_all_gone(pgids)
    # the simulator's ground truth tells the two apart: the replayed grasp carried the bowl, the no-ops never moved it
    assert set(by_trial[0].object_lift_m) == set(by_trial[1].object_lift_m) == {"akita_black_bowl_1"}
    assert by_trial[0].object_lift_m["akita_black_bowl_1"] > 0.03, by_trial[0].object_lift_m
    assert lift_label(by_trial[0].object_lift_m).startswith("lifted 0.")
    assert abs(by_trial[1].object_lift_m["akita_black_bowl_1"]) < 0.005 and lift_label(by_trial[1].object_lift_m) == "never lifted"
