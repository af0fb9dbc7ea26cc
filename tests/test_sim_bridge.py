"""The bridge from the main environment (numpy 2) to real LIBERO simulator processes (numpy 1).

Everything here runs the real simulator under .venv-libero: no part of LIBERO, robosuite or the
process handling is mocked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from rlinf_cosmos3 import paths
from rlinf_cosmos3.actions import quat_xyzw_to_axis_angle
from rlinf_cosmos3.config.libero_suites import NOOP_ACTION
from rlinf_cosmos3.demos.scripted_policy import ScriptedPickPlace
from rlinf_cosmos3.sim.client import (
    LiberoSimProcess,
    SimCommandError,
    SimProcessError,
    call_all,
    wait_for_replies,
)
from rlinf_cosmos3.sim.images import rotate_180
from rlinf_cosmos3.sim.protocol import Message, ProtocolError, decode, encode

pytestmark = pytest.mark.libero
NOOP = np.asarray(NOOP_ACTION)


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _group_gone(pgid):
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------------------- protocol (no simulator)
def test_protocol_roundtrip_keeps_dtypes_shapes_and_values() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "img": rng.integers(0, 255, size=(4, 5, 3), dtype=np.uint8),
        "f32": rng.normal(size=(7,)).astype(np.float32),
        "f64": rng.normal(size=(2, 3)),
        "flags": np.array([True, False, True]),
        "empty": np.zeros((0, 7), dtype=np.float64),
        "scalar": np.array(3, dtype=np.int64),
        "big_endian": np.arange(4, dtype=">i4"),
        "strided": np.arange(20.0).reshape(4, 5)[:, ::2],  # non-contiguous view
    }
    fields = {"cmd": "x", "nested": {"a": [1, 2.5, "s"]}, "n": np.int64(3), "ok": np.bool_(True)}
    out = decode(encode(Message(fields=fields, arrays=arrays)))
    assert out.fields == {"cmd": "x", "nested": {"a": [1, 2.5, "s"]}, "n": 3, "ok": True}
    assert set(out.arrays) == set(arrays)
    for name, arr in arrays.items():
        assert out.arrays[name].dtype == arr.dtype, name
        assert out.arrays[name].shape == arr.shape, name
        np.testing.assert_array_equal(out.arrays[name], arr)
    assert out.arrays["img"].flags.writeable


def test_protocol_rejects_object_arrays_and_truncated_messages() -> None:
    with pytest.raises(ProtocolError, match="cannot be sent"):
        encode(Message(arrays={"o": np.array([object()], dtype=object)}))
    data = encode(Message(fields={"a": 1}, arrays={"x": np.ones(10)}))
    with pytest.raises(ProtocolError):
        decode(data[:-3])
    with pytest.raises(ProtocolError):
        decode(data[:5])


def test_rotate_180_is_a_half_turn() -> None:
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    rot = rotate_180(img)
    assert rot[0, 0].tolist() == img[1, 2].tolist() and rot[1, 2].tolist() == img[0, 0].tolist()
    np.testing.assert_array_equal(rotate_180(rot), img)
    np.testing.assert_array_equal(rotate_180(np.stack([img, img]))[1], rot)


# ---------------------------------------------------------------------------- process handling
def test_echo_crosses_numpy_versions() -> None:
    """Arrays made under numpy 2 come back bit-identical from the numpy 1 simulator process."""
    arrays = {"a": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
              "b": np.arange(6, dtype=np.uint8), "c": np.array([True, False])}
    with LiberoSimProcess(name="echo") as proc:
        reply = proc.request("echo", arrays, label="hi", value=1.5)
    assert reply["numpy_version"].startswith("1.") and np.__version__.startswith("2.")
    assert reply["label"] == "hi" and reply["value"] == 1.5
    for name, arr in arrays.items():
        assert reply[name].dtype == arr.dtype
        np.testing.assert_array_equal(reply[name], arr)


def test_command_errors_keep_the_process_usable() -> None:
    with LiberoSimProcess(name="errors") as proc:
        with pytest.raises(SimCommandError, match="unknown command 'fly'"):
            proc.request("fly")
        with pytest.raises(SimCommandError, match="send 'make' first"):
            proc.step(NOOP)
        with pytest.raises(SimCommandError, match="unknown LIBERO suite 'libero_nope'"):
            proc.make("libero_nope", 0)
        assert proc.request("ping")["pid"] == proc.pid


def test_killed_child_gives_a_clear_error_not_a_hang(tmp_path) -> None:
    proc = LiberoSimProcess(name="victim", log_path=tmp_path / "victim.log")
    pgid = proc.process_id
    try:
        proc.send("make", suite="libero_spatial", task_id=0)  # takes seconds: killed mid-command
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(SimProcessError, match="died|closed its channel") as info:
            proc.recv(timeout_s=60)
        assert time.monotonic() - start < 10
        assert "simulator stderr" in str(info.value) and "victim" in str(info.value)
        assert not proc.alive
        with pytest.raises(SimProcessError, match="closed"):
            proc.request("ping")
    finally:
        proc.close()
    assert _wait_gone(pgid)


def test_timeout_kills_the_process_and_says_so(tmp_path) -> None:
    proc = LiberoSimProcess(name="slow", log_path=tmp_path / "slow.log")
    pgid = proc.process_id
    with pytest.raises(SimProcessError, match="within the timeout"):
        proc.request("make", suite="libero_spatial", task_id=0, timeout_s=0.2)
    assert _wait_gone(pgid)
    proc.close()


def test_no_process_left_after_close_or_an_exception() -> None:
    with LiberoSimProcess(name="closed") as proc:
        pgid = proc.process_id
    assert _wait_gone(pgid)
    with pytest.raises(RuntimeError, match="boom"):
        with LiberoSimProcess(name="raised") as proc:
            pgid = proc.process_id
            raise RuntimeError("boom")
    assert _wait_gone(pgid)


def test_atexit_stops_processes_the_program_forgot() -> None:
    code = textwrap.dedent("""
        from rlinf_cosmos3.sim.client import LiberoSimProcess
        proc = LiberoSimProcess(name="forgotten")
        print(proc.process_id, flush=True)
        # exits without close(): the atexit hook must stop the child
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    pgid = int(out.stdout.strip().splitlines()[-1])
    assert _wait_gone(pgid), f"simulator process group {pgid} outlived its parent"


def test_child_follows_a_parent_killed_outright(tmp_path) -> None:
    """SIGKILL leaves no atexit: the child must notice the closed pipe and exit by itself."""
    code = textwrap.dedent(f"""
        import time
        from rlinf_cosmos3.sim.client import LiberoSimProcess
        proc = LiberoSimProcess(name="orphan", log_path={str(tmp_path / "orphan.log")!r})
        print(proc.process_id, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pgid = int(parent.stdout.readline())
        assert not _group_gone(pgid)
        parent.kill()
        parent.wait(timeout=30)
        assert _wait_gone(pgid, timeout_s=30), f"simulator process group {pgid} outlived a killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_call_all_routes_replies_to_their_processes() -> None:
    procs = [LiberoSimProcess(name=f"par{i}") for i in range(2)]
    try:
        replies = call_all(procs, "echo", per_proc=[{"i": i, "x": np.full(3, i, dtype=np.int16)}
                                                   for i in range(2)], tag="same")
        assert [r["i"] for r in replies] == [0, 1]
        assert [r["x"].tolist() for r in replies] == [[0, 0, 0], [1, 1, 1]]
        assert all(r["tag"] == "same" for r in replies)
        # one failing command: every reply is still collected, then the error is raised
        with pytest.raises(SimCommandError):
            call_all(procs, "reset", per_proc=[{"init_state_id": 0}, {"init_state_id": 0}])
        assert [r["pid"] for r in call_all(procs, "ping")] == [p.pid for p in procs]
    finally:
        for p in procs:
            p.close()


def test_wait_for_replies_serves_the_fast_process_while_another_builds_its_task() -> None:
    """A process that builds a task (seconds) does not hold back one whose reply is already there."""
    slow, fast = LiberoSimProcess(name="slow-make"), LiberoSimProcess(name="fast-ping")
    try:
        slow.send("make", suite="libero_spatial", task_id=0)
        fast.send("ping")
        first = wait_for_replies([slow, fast], timeout_s=60)
        assert first == [fast]
        assert fast.recv()["pid"] == fast.pid
        t0 = time.monotonic()
        while not (ready := wait_for_replies([slow], timeout_s=1.0)):
            assert time.monotonic() - t0 < 120
        assert ready == [slow] and "task" in slow.recv()
    finally:
        slow.close()
        fast.close()


def test_wait_for_replies_fails_a_request_past_its_timeout() -> None:
    proc = LiberoSimProcess(name="overdue", timeout_s=0.5)
    pgid = proc.process_id
    try:
        proc.send("make", suite="libero_spatial", task_id=0)  # seconds, far past 0.5 s
        with pytest.raises(SimProcessError, match="no reply to 'make' within"):
            for _ in range(30):
                wait_for_replies([proc], timeout_s=0.2)
        assert not proc.alive
    finally:
        proc.close()
    assert _wait_gone(pgid)


# ---------------------------------------------------------------------------- the real environment
@pytest.fixture(scope="module")
def spatial_env():
    """libero_spatial task 0 ('pick the black bowl between the plate and the ramekin ...')."""
    with LiberoSimProcess(name="spatial0") as proc:
        info = proc.make("libero_spatial", 0, seed=0)
        yield proc, info


def test_make_reports_the_task(spatial_env) -> None:
    _, info = spatial_env
    assert info["task"] == "pick up the black bowl between the plate and the ramekin and place it on the plate"
    assert info["bddl_language"] == "pick the akita black bowl between the plate and the ramekin and place it on the plate"
    assert info["num_init_states"] == 50 and info["num_tasks"] == 10


def test_reset_and_step_observations(spatial_env) -> None:
    proc, info = spatial_env
    obs = proc.reset(0)
    assert obs["task"] == info["task"] and obs["success"] is False
    for key in ("main_image", "wrist_image"):
        assert obs[key].shape == (256, 256, 3) and obs[key].dtype == np.uint8
        assert obs[key].std() > 10, f"{key} looks blank"
    assert obs["state"].shape == (8,) and obs["state"].dtype == np.float32
    for _ in range(3):
        obs = proc.step(NOOP)
        assert obs["reward"] == 0.0 and obs["success"] is False and obs["done"] is False
    obs = proc.chunk_step(np.tile(NOOP, (7, 1)))
    # after 10 steps commanding "open", the Panda fingers are at about +-0.04 m
    left, right = obs["state"][6], obs["state"][7]
    assert 0.03 < left < 0.041 and -0.041 < right < -0.03
    # state = eef pos, eef axis-angle (robot0_eef_quat), gripper qpos: cross-checked against the
    # privileged ground truth and our own quaternion conversion (near pi the axis-angle is
    # ill-conditioned: float32 state, so 1e-3)
    priv = proc.privileged()
    np.testing.assert_allclose(obs["state"][:3], priv["eef_pos"], atol=1e-6)
    np.testing.assert_allclose(obs["state"][3:6], quat_xyzw_to_axis_angle(priv["eef_quat"]), atol=1e-3)
    np.testing.assert_allclose(obs["state"][6:], priv["gripper_qpos"], atol=1e-4)


def test_images_are_rotated_180_degrees(spatial_env) -> None:
    proc, _ = spatial_env
    proc.reset(0)
    obs = proc.chunk_step(np.tile(NOOP, (5, 1)))
    raw = proc.raw_observation()
    for key in ("main_image", "wrist_image"):
        assert not np.array_equal(obs[key], raw[key])
        np.testing.assert_array_equal(obs[key], raw[key][::-1, ::-1])
    # known orientation, as in LIBERO's datasets: agentview shows the grey wall at the top and the
    # wooden table (red >> blue) at the bottom; the wrist view has the dark fingers at the bottom
    main = obs["main_image"].astype(float)
    red_minus_blue = main[..., 0] - main[..., 2]
    assert red_minus_blue[-64:].mean() > red_minus_blue[:64].mean() + 15
    wrist = obs["wrist_image"].astype(float)
    assert wrist[:64].mean() > wrist[-48:].mean() + 40


def test_chunk_step_reports_every_executed_step(spatial_env) -> None:
    proc, _ = spatial_env
    proc.reset(1)
    actions = np.tile(NOOP, (6, 1))
    actions[:, 2] = 0.5  # move up
    before = proc.privileged()["eef_pos"]
    out = proc.chunk_step(actions, return_frames=True)
    assert out["num_steps"] == 6
    assert out["rewards"].shape == (6,) and out["successes"].shape == (6,) and out["dones"].shape == (6,)
    assert not out["successes"].any() and out["success"] is False
    assert out["main_images"].shape == (6, 256, 256, 3) and out["wrist_images"].shape == (6, 256, 256, 3)
    np.testing.assert_array_equal(out["main_images"][-1], out["main_image"])
    assert out["state"][2] - before[2] > 0.03, "commanded +z motion did not move the end effector up"
    with pytest.raises(SimCommandError, match="shape"):
        proc.chunk_step(np.zeros((3, 6)))


def test_chunk_step_renders_only_its_last_step_and_matches_rendering_every_step() -> None:
    """Without frames a chunk renders its cameras once, at its last step, and every output --
    images included -- is bit-identical to rendering every step (two simulators, same seed: a
    LIBERO reset moves the cameras slightly, so both must start from the same make)."""
    rng = np.random.default_rng(0)
    actions = rng.uniform(-0.5, 0.5, (16, 7))
    actions[:, 6] = np.sign(actions[:, 6])
    outs = []
    for frames in (True, False):
        with LiberoSimProcess(name=f"render-{frames}") as proc:
            proc.make("libero_spatial", 0, seed=0)
            proc.reset(3)
            proc.chunk_step(np.tile(NOOP, (10, 1)))
            outs.append([proc.chunk_step(actions[:7], return_frames=frames),
                         proc.chunk_step(actions[7:], return_frames=frames)])
    for every_step, last_only in zip(*outs, strict=True):
        for key in ("main_image", "wrist_image", "state", "rewards", "successes", "dones"):
            np.testing.assert_array_equal(every_step[key], last_only[key], err_msg=key)
        np.testing.assert_array_equal(every_step["main_images"][-1], last_only["main_image"])
    assert outs[1][1]["main_image"].std() > 10, "the rendered view looks blank"

    # a frame stride of 4 (a 5 fps video): the frames of the steps 12, 16 | 20, 24 since the reset (10 settle
    # steps before), equal to those of rendering every step, and the same observations
    with LiberoSimProcess(name="render-stride") as proc:
        proc.make("libero_spatial", 0, seed=0)
        proc.reset(3)
        proc.chunk_step(np.tile(NOOP, (10, 1)), return_frames=True, frame_stride=4)  # frames of steps 0, 4, 8
        strided = [proc.chunk_step(actions[:7], return_frames=True, frame_stride=4),
                   proc.chunk_step(actions[7:], return_frames=True, frame_stride=4)]
        between = proc.chunk_step(actions[:2], return_frames=True, frame_stride=4)  # steps 26, 27: none filmed
    assert between["main_images"].shape == between["wrist_images"].shape == (0, 256, 256, 3)
    for every_step, sparse, picked in zip(outs[0], strided, ([2, 6], [3, 7]), strict=True):
        for key in ("main_image", "wrist_image", "state", "rewards"):
            np.testing.assert_array_equal(every_step[key], sparse[key], err_msg=key)
        for key in ("main_images", "wrist_images"):
            np.testing.assert_array_equal(every_step[key][picked], sparse[key], err_msg=key)

    # how many times robosuite's renderer runs, counted inside the simulator's own interpreter
    script = textwrap.dedent("""
        import numpy as np
        from rlinf_cosmos3.sim.libero_session import LiberoSession
        s = LiberoSession(); s.make("libero_spatial", 0); s.reset(0)
        sim = s._env.env.sim
        render, calls = sim.render, []
        sim.render = lambda *a, **k: calls.append(1) or render(*a, **k)
        noop = np.tile([0, 0, 0, 0, 0, 0, -1.0], (8, 1))
        s.chunk_step(noop); plain = len(calls)
        s.chunk_step(noop, return_frames=True); print(plain, len(calls) - plain)
        s.chunk_step(noop, stop_on_success=True)
    """)
    from rlinf_cosmos3.sim.client import simulator_env

    run = subprocess.run([str(paths.libero_python()), "-c", script], env=simulator_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-2:] == ["2", "16"], run.stdout  # 2 cameras x 1 step vs x 8 steps


@pytest.mark.slow
def test_success_flag_goes_true_and_replays_deterministically(spatial_env) -> None:
    """The scripted policy solves init state 0; replaying its commands in one chunk_step from the
    same init state reproduces the success and stops at the first successful step."""
    proc, _ = spatial_env
    obs = proc.reset(0, privileged=True)
    obs = proc.chunk_step(np.tile(NOOP, (10, 1)), privileged=True)
    policy = ScriptedPickPlace(obs["goal"])
    commands, first_success = [], None
    for t in range(200):
        command = policy.act(obs)
        commands.append(command)
        obs = proc.step(command, privileged=True)
        if obs["success"] and first_success is None:
            first_success = t
        if policy.done:
            break
    assert first_success is not None, "scripted policy did not solve libero_spatial task 0, init state 0"

    proc.reset(0)
    proc.chunk_step(np.tile(NOOP, (10, 1)))
    out = proc.chunk_step(np.stack(commands), stop_on_success=True)
    assert out["success"] is True
    assert out["num_steps"] == first_success + 1
    assert out["successes"][-1] and not out["successes"][:-1].any()
