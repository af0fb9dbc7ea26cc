"""Process-group helpers shared by everything that starts child processes (simulators, servers).

Stdlib only: the simulator side imports the package too.
"""

from __future__ import annotations

import os


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists (signal 0 probes without killing)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
