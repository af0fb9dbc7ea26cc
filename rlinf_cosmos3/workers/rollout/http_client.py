"""Async HTTP client for one SGLang server: timeouts, retries with backoff, errors that say where.

Retried (exponential backoff): connection errors, dropped connections, timeouts and 5xx answers —
what a busy, restarting or briefly overloaded server produces. Not retried: 4xx, which means the
request itself is wrong (the server's message is raised). Before each retry the optional ``alive``
callback is asked; when the server process is gone the client gives up at once with
:class:`ServerDiedError`, so the caller can restart it instead of waiting out the backoff.

Proxies from the environment are ignored (``trust_env=False``): a proxy in front of 127.0.0.1 is
the reference FAQ's "local requests blocked" failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from rlinf_cosmos3.workers.rollout import codec

logger = logging.getLogger(__name__)
# httpx logs every request at INFO, which would drown the eval log (hundreds of requests per
# epoch); this client logs retries and failures itself. An explicitly configured level is kept.
if logging.getLogger("httpx").level == logging.NOTSET:
    logging.getLogger("httpx").setLevel(logging.WARNING)

ACTION_PATH = "/v1/actions/generations"
HEALTH_PATH = "/health"


class RequestRejectedError(RuntimeError):
    """The server answered 4xx: the request is wrong and retrying cannot help."""

    def __init__(self, url: str, status: int, message: str) -> None:
        self.url, self.status, self.message = url, status, message
        super().__init__(f"{url} rejected the request with HTTP {status}: {message}")


class ServerUnavailableError(RuntimeError):
    """No usable answer after every attempt (connection errors, timeouts or 5xx)."""

    def __init__(self, url: str, attempts: int, last_error: str) -> None:
        self.url, self.attempts, self.last_error = url, attempts, last_error
        super().__init__(f"{url}: no answer after {attempts} attempt(s); last error: {last_error}")


class ServerDiedError(ServerUnavailableError):
    """The server process is gone (the ``alive`` check failed); restart it rather than retry."""


def _describe(response: httpx.Response) -> str:
    """The server's error message, however it was encoded."""
    try:
        body = codec.decode(response.content, response.headers.get("content-type", ""))
    except ValueError:
        return response.text[:2000] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:2000]
    return str(body)[:2000]


class ActionHTTPClient:
    """One server's base URL; ``post`` sends a payload in ``encoding`` and returns the decoded answer."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        encoding: str = "msgpack",
        alive: Callable[[], bool] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s))
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.encoding = encoding
        self.alive = alive
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session(self) -> httpx.AsyncClient:
        """A connection pool for the running event loop (httpx pools cannot move between loops)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            self._client = httpx.AsyncClient(timeout=self.timeout, trust_env=False)
            self._loop = loop
        return self._client

    def backoff(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based): backoff_s * 2^(attempt-1), capped."""
        return min(self.backoff_s * 2 ** (attempt - 1), self.backoff_max_s)

    async def post(self, payload: Any, path: str = ACTION_PATH) -> Any:
        """POST ``payload``; retry transient failures; return the decoded response body."""
        url = f"{self.base_url}{path}"
        body, headers = codec.encode(payload, self.encoding)
        attempts = 1 + self.max_retries
        last_error = "no attempt made"
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                if self.alive is not None and not self.alive():
                    raise ServerDiedError(url, attempt - 1, f"server process exited ({last_error})")
                delay = self.backoff(attempt - 1)
                logger.warning("%s: attempt %d/%d failed (%s); retrying in %.1f s",
                               url, attempt - 1, attempts, last_error, delay)
                await asyncio.sleep(delay)
            start = time.monotonic()
            try:
                response = await self._session().post(url, content=body, headers=headers)
            except httpx.TransportError as err:  # connect/read/write errors, dropped connections, timeouts
                last_error = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
                continue
            if response.status_code >= 500:
                last_error = f"HTTP {response.status_code}: {_describe(response)}"
                continue
            if response.status_code >= 400:
                raise RequestRejectedError(url, response.status_code, _describe(response))
            logger.debug("%s answered in %.3f s (attempt %d)", url, time.monotonic() - start, attempt)
            return codec.decode(response.content, response.headers.get("content-type", ""))
        if self.alive is not None and not self.alive():
            raise ServerDiedError(url, attempts, f"server process exited ({last_error})")
        raise ServerUnavailableError(url, attempts, last_error)

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        """True when ``GET /health`` answers 200 now (no retries)."""
        try:
            response = await self._session().get(f"{self.base_url}{HEALTH_PATH}", timeout=timeout_s)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        """Close the pool (only the running loop's own pool can be closed; others are dropped)."""
        client, loop = self._client, self._loop
        self._client, self._loop = None, None
        if client is not None and not client.is_closed and loop is asyncio.get_running_loop():
            await client.aclose()
