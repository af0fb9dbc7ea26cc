"""procgroup.stop_group on real process groups: a polite group, one that ignores SIGTERM, and a
group whose leader exits first while its child stays behind."""

from __future__ import annotations

import subprocess
import sys
import time

from rlinf_cosmos3.procgroup import group_alive, stop_group

# A leader that forks one child; both sleep. IGNORE makes both ignore SIGTERM.
SCRIPT = """
import os, signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    time.sleep(600)
    os._exit(0)
if sys.argv[1] == "leader-exits":
    sys.exit(0)  # the child keeps the group alive, reparented to init
print("ready", flush=True)
time.sleep(600)
"""


def start(mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    if mode != "leader-exits":
        assert proc.stdout.readline().strip() == "ready"
    else:
        proc.wait(timeout=30)
    assert group_alive(proc.pid)
    return proc


def test_a_group_that_stops_on_sigterm_is_not_killed() -> None:
    proc = start("polite")
    assert stop_group(proc, grace_s=10) is False
    assert proc.returncode == -15 and not group_alive(proc.pid)


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    proc = start("ignore")
    t0 = time.monotonic()
    assert stop_group(proc, grace_s=1.0) is True
    assert time.monotonic() - t0 >= 1.0
    assert proc.returncode == -9 and not group_alive(proc.pid)


def test_children_left_by_an_exited_leader_are_stopped_too() -> None:
    proc = start("leader-exits")
    assert stop_group(proc, grace_s=10) is False
    assert not group_alive(proc.pid)
    stop_group(proc, grace_s=1)  # idempotent on a gone group
