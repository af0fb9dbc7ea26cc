"""Stop what a driver started when the driver is killed outright (SIGKILL, the out-of-memory killer).

A driver that dies without running its cleanup leaves its private Ray (GCS, raylet, dashboard and
runtime-env agents, idle workers) and whatever it launched running. Before it starts Ray,
:class:`~rlinf_cosmos3.cluster.cluster.Cluster` puts a token into its environment (``DRIVER_ENV``), which
every process started from then on inherits (Ray's own, actors, simulators, servers, evaluations), and
starts this reaper in a session of its own. The reaper waits for the driver to end; then every live
process whose environment carries the token gets SIGTERM and, ``GRACE_S`` later, SIGKILL. A driver that
shuts down normally stops the reaper first (nothing is left to stop then)::

    python -m rlinf_cosmos3.cluster.reaper <driver pid> <token>
"""

from __future__ import annotations

import signal
import sys
import time

import psutil

from rlinf_cosmos3.procgroup import processes_with_env

DRIVER_ENV = "RLINF_COSMOS3_DRIVER"
POLL_S = 0.5
GRACE_S = 5.0


def tagged(token: str) -> list[psutil.Process]:
    """Live processes (other than this one) whose environment holds ``DRIVER_ENV=token``."""
    return processes_with_env(DRIVER_ENV, token.__eq__)


def sweep(token: str, grace_s: float = GRACE_S) -> int:
    """SIGTERM every tagged process, SIGKILL those still alive after ``grace_s``; returns how many there were."""
    procs = tagged(token)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive + tagged(token):  # and any started while the first ones stopped
        try:
            proc.kill()
        except psutil.Error:
            continue
    return len(procs)


def watch(driver_pid: int, token: str) -> int:
    """Wait for ``driver_pid`` to end, then sweep its processes; returns how many were stopped."""
    try:
        driver = psutil.Process(driver_pid)
        while driver.is_running() and driver.status() != psutil.STATUS_ZOMBIE:
            time.sleep(POLL_S)
    except psutil.NoSuchProcess:
        pass
    return sweep(token)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the driver shut down normally
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the driver's terminal is the driver's to handle
    stopped = watch(int(argv[0]), argv[1])
    if stopped:
        print(f"rlinf_cosmos3 reaper: driver {argv[0]} ended without stopping {stopped} process(es); stopped them",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
