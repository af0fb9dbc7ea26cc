"""What a refused input may leave behind: nothing. Used by the bad-input tests around every test.

:func:`nothing_left_running` records this process's descendants, runs the block, and then fails if
a new one is still alive (a simulator, an ``sglang serve``, a Ray raylet or GCS, a stray worker)
or if this process is still connected to Ray. Descendants are reaped asynchronously after a
process group is killed, so it waits a few seconds for them to go.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


def _descendants() -> dict[int, psutil.Process]:
    alive = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive[proc.pid] = proc
        except psutil.NoSuchProcess:
            continue
    return alive


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"{proc.pid}: (gone)"


@contextmanager
def nothing_left_running(grace_s: float = 10.0) -> Iterator[None]:
    """Fail if the block leaves a new descendant process alive or Ray initialised."""
    before = set(_descendants())
    yield
    deadline = time.monotonic() + grace_s
    while (left := [p for pid, p in _descendants().items() if pid not in before]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "processes left running: " + "; ".join(_describe(p) for p in left)
    if "ray" in sys.modules:  # imported by something the block ran: it must not stay connected
        import ray

        assert not ray.is_initialized(), "Ray is still initialised"
