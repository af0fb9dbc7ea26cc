"""Process-group helpers shared by everything that starts child processes (simulators, servers).

Stdlib only: the simulator side imports the package too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists (signal 0 probes without killing)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = 10.0) -> bool:
    """Stop the process group that ``proc`` leads (started with ``start_new_session``): SIGTERM, up to
    ``grace_s`` for the whole group to exit, then SIGKILL and up to ``kill_wait_s`` more; ``proc`` is
    reaped either way. Returns whether SIGKILL was needed. Children that left the group are not
    reached here (the cluster reaper finds them by their environment tag)."""
    pgid = proc.pid  # a session leader: pgid == pid
    killed = False
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        proc.poll()  # reap the leader so that it stops counting as a member
        if not group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        killed = sig == signal.SIGKILL
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(pgid):
                break
            time.sleep(0.1)
    try:
        proc.wait(timeout=kill_wait_s)
    except subprocess.TimeoutExpired:
        pass  # unkillable (D state): the caller logs proc.returncode None
    return killed


def processes_with_env(name: str, accept: Callable[[str], bool]) -> list[Any]:
    """Live processes (zombies do not count, nor this one) whose environment holds ``name`` with a value
    ``accept`` takes: how a tag every child inherits finds what a run left, whatever its process group
    or parent. psutil ``Process`` objects (imported here: the simulator side never calls this)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            value = proc.environ().get(name)
            if value is not None and accept(value) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # gone meanwhile, or another user's
            continue
    return found


@contextmanager
def keep_scheduling() -> Iterator[None]:
    """Restore this thread's CPU scheduling policy after the block.

    The SVT-AV1 encoder (lerobot's default video codec) run as root switches the calling thread to
    SCHED_FIFO priority 99; every process forked afterwards inherits it, and a few busy real-time
    processes on a small machine starve everything else (simulators, servers, the shell) for minutes.
    """
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != before:
            os.sched_setscheduler(0, before[0], before[1])
