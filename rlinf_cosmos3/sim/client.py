"""Driving LIBERO simulator processes from the main environment.

LIBERO needs numpy < 2 and the main environment has numpy >= 2, so each simulator runs as a child
process under the simulator environment's interpreter (``rlinf_cosmos3.paths.libero_python()``)
and talks :mod:`rlinf_cosmos3.sim.protocol` over its stdin/stdout. The child lives in its own process
group, its stderr goes to a log file whose tail is quoted in every error, and a process is never left
behind: ``close()`` asks politely, then SIGTERMs and finally SIGKILLs the group; an ``atexit`` hook
does the same for anything still open when the interpreter exits.

Several processes step in parallel by sending to all of them first and collecting the replies
afterwards (:func:`send_all` / :func:`recv_all`, or :func:`call_all`).
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cosmos3 import paths
from rlinf_cosmos3.procgroup import stop_group
from rlinf_cosmos3.sim.protocol import (
    PREFIX_SIZE,
    Message,
    ProtocolError,
    decode_body,
    encode,
    parse_prefix,
    reset_fields,
    split_arrays,
)

logger = logging.getLogger(__name__)

SERVER_MODULE = "rlinf_cosmos3.sim.libero_server"
DEFAULT_TIMEOUT_S = 300.0
STARTUP_TIMEOUT_S = 120.0
Reply = dict[str, Any]

_LIVE: weakref.WeakSet[LiberoSimProcess] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class SimProcessError(RuntimeError):
    """The simulator process died, hung past its timeout or broke the protocol; it is unusable."""


class SimCommandError(RuntimeError):
    """A command failed inside the simulator (bad argument, LIBERO error); the process lives on."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


def require_simulator_python(python: str | os.PathLike[str] | None = None) -> Path:
    """The simulator environment's interpreter (default: ``paths.libero_python()``); FileNotFoundError
    saying how to get one when it is not there."""
    path = Path(python) if python is not None else paths.libero_python()
    if not path.exists():
        raise FileNotFoundError(
            f"simulator interpreter {path} not found; build it with requirements/install.sh "
            "or point RLINF_COSMOS3_LIBERO_PYTHON at it")
    return path


def simulator_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a simulator child: LIBERO's config dir, EGL rendering, and only this
    checkout on PYTHONPATH (an inherited main-environment PYTHONPATH could shadow numpy < 2)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update({
        "LIBERO_CONFIG_PATH": str(paths.libero_config_dir()),
        "MUJOCO_GL": "egl",
        "PYOPENGL_PLATFORM": "egl",
        "PYTHONPATH": str(paths.REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    if extra:
        env.update(extra)
    return env


class LiberoSimProcess:
    """One simulator child process holding (at most) one LIBERO task environment.

    Use as a context manager. Every request has a timeout; if the child dies or times out a
    :class:`SimProcessError` quoting its stderr tail is raised and the process group is killed.
    """

    def __init__(self, *, python: str | os.PathLike[str] | None = None, log_path: str | os.PathLike[str] | None = None,
                 extra_env: Mapping[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, name: str = "libero-sim") -> None:
        self.name = name
        self.timeout_s = timeout_s
        self._python = require_simulator_python(python)
        self._own_log = log_path is None
        if log_path is None:
            fd, tmp = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
            os.close(fd)
            log_path = tmp
        self.log_path = Path(log_path)
        self._pending: str | None = None
        self._sent_at = 0.0  # monotonic time the pending request was sent
        self._closed = False
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(self._python), "-m", SERVER_MODULE],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=simulator_env(extra_env), start_new_session=True, close_fds=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self.pid = int(self.request("ping", timeout_s=startup_timeout_s)["pid"])
        except BaseException:
            self.kill()
            raise

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> LiberoSimProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LiberoSimProcess(name={self.name!r}, pid={self._proc.pid}, alive={self.alive})"

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc.poll() is None

    @property
    def process_id(self) -> int:
        """OS pid of the child (also its process group id)."""
        return self._proc.pid

    # ------------------------------------------------------------------ diagnostics
    def stderr_tail(self, max_lines: int = 40, max_bytes: int = 16384) -> str:
        """Last lines the child wrote to stderr (robosuite/LIBERO output and our tracebacks)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                text = f.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return f"<stderr log unreadable: {exc}>"
        return "\n".join(text.splitlines()[-max_lines:])

    def _fail(self, what: str) -> SimProcessError:
        """Kill the group and build an error that says what happened and what the child said."""
        code = self._proc.poll()
        self.kill(keep_log=True)
        status = f"exit code {code}" if code is not None else "killed after the failure"
        return SimProcessError(
            f"{self.name} (pid {self._proc.pid}): {what} ({status}); log {self.log_path}\n"
            f"--- simulator stderr (tail) ---\n{self.stderr_tail()}")

    # ------------------------------------------------------------------ request / reply
    def send(self, cmd: str, arrays: Mapping[str, np.ndarray] | None = None, **fields: Any) -> None:
        """Send one request without waiting; pair with :meth:`recv`. One request may be pending."""
        if self._closed:
            raise SimProcessError(f"{self.name} is closed")
        if self._pending is not None:
            raise RuntimeError(f"{self.name}: reply to {self._pending!r} not collected yet")
        msg = Message(fields={"cmd": cmd, **fields}, arrays={k: np.asarray(v) for k, v in (arrays or {}).items()})
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(encode(msg))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._fail(f"could not send {cmd!r}: {exc}") from exc
        self._pending = cmd
        self._sent_at = time.monotonic()

    def _read_exact(self, n: int, deadline: float, cmd: str) -> bytes:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], min(max(remaining, 0.0), 1.0))
            if not ready:  # what has arrived is read even at the deadline
                if self._proc.poll() is not None:
                    raise self._fail(f"simulator process died while handling {cmd!r}")
                if remaining <= 0:
                    raise self._fail(f"no complete reply to {cmd!r} within the timeout")
                continue
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                self._proc.wait(timeout=5)
                raise self._fail(f"simulator process closed its channel while handling {cmd!r}")
            buf.extend(chunk)
        return bytes(buf)

    def fileno(self) -> int:
        """The reply channel's descriptor, so that a caller can wait on many simulators at once."""
        assert self._proc.stdout is not None
        return self._proc.stdout.fileno()

    def overdue(self, now: float) -> bool:
        """A request is pending and has had no reply for longer than ``timeout_s``."""
        return self._pending is not None and now - self._sent_at > self.timeout_s

    def fail_overdue(self) -> SimProcessError:
        """Kill the overdue process; the error to raise says which request got no reply."""
        return self._fail(f"no reply to {self._pending!r} within {self.timeout_s:.0f} s")

    def recv(self, timeout_s: float | None = None) -> Reply:
        """Collect the reply to the pending request: its fields and arrays in one dict."""
        if self._pending is None:
            raise RuntimeError(f"{self.name}: no request pending")
        cmd = self._pending
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        try:
            header_len, payload_len = parse_prefix(self._read_exact(PREFIX_SIZE, deadline, cmd))
            header = self._read_exact(header_len, deadline, cmd)
            payload = self._read_exact(payload_len, deadline, cmd)
            reply = decode_body(header, payload)
        except ProtocolError as exc:
            raise self._fail(f"protocol error in the reply to {cmd!r}: {exc}") from exc
        except BaseException:
            # Interrupted mid-reply (Ctrl-C, ...): the channel is out of step, so the process goes.
            if not self._closed:
                self.kill()
            raise
        finally:
            self._pending = None
        fields = dict(reply.fields)
        if not fields.pop("ok", False):
            raise SimCommandError(
                f"{self.name}: {cmd!r} failed in the simulator: {fields.get('error')}\n{fields.get('traceback', '')}",
                remote_traceback=str(fields.get("traceback", "")))
        return {**fields, **reply.arrays}

    def request(self, cmd: str, arrays: Mapping[str, np.ndarray] | None = None,
                timeout_s: float | None = None, **fields: Any) -> Reply:
        """Send a request and wait for its reply."""
        self.send(cmd, arrays, **fields)
        return self.recv(timeout_s)

    # ------------------------------------------------------------------ commands
    def make(self, suite: str, task_id: int, *, camera_height: int = 256, camera_width: int = 256,
             seed: int = 0, horizon: int = 1000, hard_reset: bool = True,
             skip_repeated_forward: bool = True) -> Reply:
        """Build ``suite``'s task ``task_id``; returns ``task`` (language), ``num_init_states``...
        ``skip_repeated_forward=False``: robosuite's step exactly as shipped (``sim/repeated_forward.py``)."""
        return self.request("make", suite=suite, task_id=int(task_id), camera_height=camera_height,
                            camera_width=camera_width, seed=int(seed), horizon=int(horizon), hard_reset=hard_reset,
                            skip_repeated_forward=bool(skip_repeated_forward))

    def reset(self, init_state_id: int, *, privileged: bool = False, init_state_task_id: int | None = None,
              seed: int | None = None) -> Reply:
        """Reset to LIBERO's fixed init state ``init_state_id`` (of task ``init_state_task_id`` of the suite,
        when given: an instruction swap); returns the observation (``main_image``, ``wrist_image``,
        ``state``, ``task``, ``success``). ``seed``: the scene's furniture placed from this seed, not from
        this process's history (``LiberoSession.reset``)."""
        return self.request("reset", **reset_fields(init_state_id, privileged=privileged,
                                                    init_state_task_id=init_state_task_id, seed=seed))

    def step(self, action: np.ndarray, *, privileged: bool = False) -> Reply:
        """One 7-D OSC_POSE delta action; returns obs plus ``reward``, ``done``, ``success``
        (and the privileged scene state if asked)."""
        return self.request("step", {"action": np.asarray(action, dtype=np.float64)}, privileged=privileged)

    def chunk_step(self, actions: np.ndarray, *, stop_on_success: bool = False,
                   return_frames: bool = False, frame_stride: int = 1, privileged: bool = False) -> Reply:
        """Up to K actions in one round trip; returns the final obs, per-step ``rewards``,
        ``successes``, ``dones`` and ``num_steps`` (fewer than K if it stopped early at ``done``
        or, with ``stop_on_success``, at the first success); with ``return_frames`` the frames of every
        ``frame_stride``-th step since the reset."""
        return self.request("chunk_step", {"actions": np.asarray(actions, dtype=np.float64)},
                            stop_on_success=stop_on_success, return_frames=return_frames,
                            frame_stride=frame_stride, privileged=privileged)

    def privileged(self) -> Reply:
        """Ground-truth goal, robot and object state (see ``libero_privileged.collect_privileged``)."""
        return self.request("privileged")

    def raw_observation(self) -> Reply:
        """The last camera images as robosuite rendered them, before the 180° rotation."""
        return self.request("raw_observation")

    # ------------------------------------------------------------------ shutdown
    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the child to exit, then SIGTERM, then SIGKILL its process group. Idempotent."""
        if self._closed:
            return
        if self._proc.poll() is None and self._pending is None:
            try:
                self.request("close", timeout_s=timeout_s)
            except (SimProcessError, SimCommandError) as exc:
                logger.warning("%s: polite close failed: %s", self.name, str(exc).splitlines()[0])
        self.kill()

    def kill(self, grace_s: float = 5.0, keep_log: bool = False) -> None:
        """SIGTERM then SIGKILL the whole process group and reap the child. The temporary stderr
        log is removed unless ``keep_log`` (failures keep it for inspection)."""
        self._closed = True
        with _LIVE_LOCK:
            _LIVE.discard(self)
        stop_group(self._proc, grace_s, kill_wait_s=grace_s)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError as exc:
                    logger.debug("closing a pipe of %s: %s", self.name, exc)
        if self._own_log and not keep_log and self.log_path.exists():
            self.log_path.unlink()



def wait_for_replies(procs: Sequence[LiberoSimProcess], timeout_s: float) -> list[LiberoSimProcess]:
    """The processes among ``procs`` (each with a request pending) whose reply has begun to arrive or whose
    channel has closed, waiting up to ``timeout_s`` for the first: their ``recv`` returns (or raises) without
    waiting on the others. A process whose request is older than its own timeout fails here, as its ``recv``
    would have."""
    ready, _, _ = select.select(list(procs), [], [], timeout_s)
    if not ready:
        now = time.monotonic()
        for proc in procs:
            if proc.overdue(now):
                raise proc.fail_overdue()
    return ready


def send_all(procs: Sequence[LiberoSimProcess], cmd: str,
             per_proc: Sequence[Mapping[str, Any]] | None = None, **common: Any) -> None:
    """Send ``cmd`` to every process (``per_proc[i]`` adds/overrides fields and arrays for process i)."""
    if per_proc is not None and len(per_proc) != len(procs):
        raise ValueError(f"per_proc has {len(per_proc)} entries for {len(procs)} processes")
    for i, proc in enumerate(procs):
        msg = split_arrays({**common, **(per_proc[i] if per_proc is not None else {})})
        proc.send(cmd, msg.arrays, **msg.fields)


def recv_all(procs: Sequence[LiberoSimProcess], timeout_s: float | None = None) -> list[Reply]:
    """Collect every pending reply (all of them, so no process is left out of step), then raise the
    first error if any."""
    replies: list[Reply] = []
    first_error: BaseException | None = None
    for proc in procs:
        try:
            replies.append(proc.recv(timeout_s))
        except (SimCommandError, SimProcessError) as exc:
            first_error = first_error or exc
            replies.append({})
    if first_error is not None:
        raise first_error
    return replies


def call_all(procs: Sequence[LiberoSimProcess], cmd: str, per_proc: Sequence[Mapping[str, Any]] | None = None,
             timeout_s: float | None = None, **common: Any) -> list[Reply]:
    """Run one command on all processes concurrently (each child uses its own core)."""
    send_all(procs, cmd, per_proc, **common)
    return recv_all(procs, timeout_s)


@atexit.register
def _close_all_at_exit() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        proc.kill(grace_s=2.0)
