"""Stop live server groups when the driver exits: normally (atexit), or on SIGTERM / SIGINT.

Servers run in their own sessions, so nothing else would stop them when the driver goes away.
Handlers are installed once, only from the main thread (Python's rule for ``signal.signal``),
and chain to whatever handler was there before: after the groups are closed, SIGINT still raises
KeyboardInterrupt and SIGTERM still ends the process. A driver killed with SIGKILL cannot run
anything; its servers are then stopped by the reaper its Cluster started
(:mod:`rlinf_cosmos3.cluster.reaper`; their process groups are also logged at launch).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class Closable(Protocol):
    def close(self) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_installed_atexit = False
_previous: dict[int, Any] = {}


def close_all() -> None:
    """Close every registered group (each close is idempotent); errors are logged, not raised."""
    for group in list(_live):
        try:
            group.close()
        except Exception:  # one failing group must not keep the others alive
            logger.exception("closing %r failed", group)


def _handler(signum: int, frame: FrameType | None) -> None:
    logger.warning("signal %s: stopping %d process group(s) (rollout servers, online evaluations)",
                   signal.Signals(signum).name, len(_live))
    close_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def register(group: Closable) -> None:
    """Have ``group.close()`` run at exit and on SIGTERM/SIGINT (until :func:`unregister`)."""
    global _installed_atexit
    with _lock:
        _live.add(group)
        if not _installed_atexit:
            atexit.register(close_all)
            _installed_atexit = True
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                current: Callable[..., Any] | int | None = signal.getsignal(sig)
                if current is not _handler:
                    _previous[sig] = current
                    signal.signal(sig, _handler)


def unregister(group: Closable) -> None:
    with _lock:
        _live.discard(group)
