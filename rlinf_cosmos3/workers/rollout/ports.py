"""Free TCP ports for SGLang servers, without collisions between groups or processes.

An ``sglang serve`` process needs four ports: HTTP ``P``, its ZMQ broker ``P + 1`` (SGLang derives
it), the scheduler and the master port. Left alone, SGLang probes fixed defaults (5555 + random,
30005) and silently moves to another port when one is taken — two servers started together race
for the same ones, and the HTTP port it ends up on may not be the one we poll. So we choose all
four ourselves, launch with ``--strict-ports`` and keep each chosen port reserved while its server
lives: a port is taken when this process or any other holds an exclusive ``flock`` on its lock
file (released automatically when the holder exits, even by SIGKILL) and it must also bind now.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_PORT = 65535
LOCK_DIR_ENV = "RLINF_COSMOS3_PORT_LOCK_DIR"
SERVER_PORTS = 4
"""HTTP, broker (HTTP + 1), scheduler, master."""


def lock_dir() -> Path:
    path = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "rlinf_cosmos3_ports")
    path.mkdir(parents=True, exist_ok=True)
    return path


def port_is_free(port: int) -> bool:
    """True when nothing listens on (or lingers at) ``port`` on any interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


@dataclass
class PortBlock:
    """Consecutive ports held for one server; ``release`` (idempotent) frees them for others."""

    ports: tuple[int, ...]
    _fds: list[int] = field(default_factory=list, repr=False)

    @property
    def http(self) -> int:
        return self.ports[0]

    @property
    def scheduler(self) -> int:
        return self.ports[2]

    @property
    def master(self) -> int:
        return self.ports[3]

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing the descriptor drops its flock

    def __del__(self) -> None:
        self.release()


def _try_lock(port: int) -> int | None:
    fd = os.open(lock_dir() / f"port-{port}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def reserve_port_block(start: int, count: int = SERVER_PORTS) -> PortBlock:
    """The first ``count`` consecutive ports at or above ``start`` that are unlocked and bindable."""
    port = start
    while port + count - 1 <= MAX_PORT:
        fds: list[int] = []
        for candidate in range(port, port + count):
            fd = _try_lock(candidate)
            if fd is None or not port_is_free(candidate):
                if fd is not None:
                    os.close(fd)
                break
            fds.append(fd)
        if len(fds) == count:
            return PortBlock(tuple(range(port, port + count)), fds)
        for fd in fds:
            os.close(fd)
        port += len(fds) + 1  # skip past the port that was taken
    raise RuntimeError(f"no {count} consecutive free ports between {start} and {MAX_PORT}")
