"""A running SGLang server this run attaches to (``rollout.sglang.server_urls``) but does not own.

For researchers who keep servers up between evals, or run them on other machines: the group talks
to it like to one of its own servers, but never launches, restarts or stops it. At start it must
answer ``GET /health`` within :data:`ATTACH_HEALTH_TIMEOUT_S` -- a wrong URL fails in seconds, not
after the launch timeout meant for a loading model. Its liveness is unknown to us (no process),
so a server that stops answering exhausts the HTTP client's retries and fails the run with an
error naming its URL, instead of being restarted.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from rlinf_cosmos3.workers.rollout.http_client import HEALTH_PATH
from rlinf_cosmos3.workers.rollout.server_process import ServerStartError

ATTACH_HEALTH_TIMEOUT_S = 30.0
_POLL_S = 0.5


class AttachedServer:
    """The :class:`~rlinf_cosmos3.workers.rollout.sglang_group.ServerHandle` of a server started elsewhere."""

    def __init__(self, url: str, rank: int) -> None:
        self.rank = rank
        self._url = url.rstrip("/")

    @property
    def url(self) -> str:
        return self._url

    @property
    def pid(self) -> int | None:
        return None  # not a process of ours

    def launch(self) -> None:
        """Nothing to launch: it is already running."""

    def alive(self) -> bool:
        return True  # unknown; an unanswering server shows as an HTTP error naming its URL

    async def wait_healthy(self, timeout_s: float) -> float:
        """Poll ``GET /health`` for at most ``min(timeout_s, ATTACH_HEALTH_TIMEOUT_S)``; raises ServerStartError."""
        limit = min(timeout_s, ATTACH_HEALTH_TIMEOUT_S)
        start = time.monotonic()
        last = "no answer"
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            while True:
                try:
                    response = await client.get(f"{self._url}{HEALTH_PATH}")
                    if response.status_code == 200:
                        return time.monotonic() - start
                    last = f"HTTP {response.status_code}"
                except httpx.TransportError as err:
                    last = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
                if time.monotonic() - start > limit:
                    raise ServerStartError(
                        f"the running sglang server at {self._url} (rollout.sglang.server_urls) is not healthy "
                        f"after {limit:.0f} s ({last}); start it, fix the URL, or leave rollout.sglang.server_urls "
                        "unset to have the run launch its own servers")
                await asyncio.sleep(_POLL_S)

    def port_race_lost(self) -> bool:
        return False

    def log_tail(self) -> str:
        return f"(a server this run attached to: its log is wherever {self._url} was started)"

    def stop(self) -> None:
        """Never stopped by us: whoever started it keeps it."""
