"""ActionHTTPClient against a real local HTTP server that misbehaves on purpose.

The server (stdlib ``http.server`` in a thread) follows a script, one entry per incoming request:
``drop`` closes the connection without answering, ``hang`` answers too late, a number answers
with that status. Requests past the script get 200 with a msgpack action body.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from rlinf_cosmos3.workers.rollout import codec
from rlinf_cosmos3.workers.rollout.http_client import (
    ActionHTTPClient,
    RequestRejectedError,
    ServerDiedError,
    ServerUnavailableError,
)

ACTIONS = np.linspace(-1, 1, 16 * 10, dtype=np.float32).reshape(1, 16, 10)


class _ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, script: list[str | int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = list(script)
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _ScriptedServer

    def log_message(self, format: str, *args: object) -> None:  # keep pytest output clean
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.bodies.append(body)
            step = self.server.script.pop(0) if self.server.script else 200
        if step == "drop":
            self.close_connection = True
            self.connection.close()  # the client sees the connection end without a response
            return
        if step == "hang":
            time.sleep(1.0)
            step = 200
        if step == 200:
            content = codec.encode_msgpack({"actions": ACTIONS})
            ctype = codec.MSGPACK_CONTENT_TYPE
        else:
            content = codec.encode_json({"detail": f"scripted failure {step}"})
            ctype = codec.JSON_CONTENT_TYPE
        self.send_response(int(step))
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)


@pytest.fixture()
def serve() -> Iterator:
    servers: list[_ScriptedServer] = []

    def start(script: list[str | int]) -> _ScriptedServer:
        server = _ScriptedServer(script)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _client(url: str, **kwargs) -> ActionHTTPClient:
    options = {"timeout_s": 5.0, "max_retries": 2, "backoff_s": 0.05, "backoff_max_s": 0.2}
    return ActionHTTPClient(url, **{**options, **kwargs})


def _post(client: ActionHTTPClient, payload: dict):
    async def go():
        try:
            return await client.post(payload)
        finally:
            await client.aclose()

    return asyncio.run(go())


PAYLOAD = {"input": {"task": ["t"], "observation": {"image": np.zeros((1, 8, 8, 3), np.uint8)}}}


def test_dropped_connection_is_retried(serve) -> None:
    server = serve(["drop"])
    response = _post(_client(server.url), PAYLOAD)
    np.testing.assert_array_equal(response["actions"], ACTIONS)
    assert len(server.bodies) == 2  # the dropped attempt and the retry
    assert server.bodies[0] == server.bodies[1] == codec.encode_msgpack(PAYLOAD)


def test_5xx_and_timeout_are_retried(serve) -> None:
    server = serve([503, "hang"])
    response = _post(_client(server.url, timeout_s=0.3), PAYLOAD)
    np.testing.assert_array_equal(response["actions"], ACTIONS)
    assert len(server.bodies) == 3


def test_4xx_is_raised_at_once_with_the_servers_message(serve) -> None:
    server = serve([400])
    with pytest.raises(RequestRejectedError, match="HTTP 400: scripted failure 400") as info:
        _post(_client(server.url), PAYLOAD)
    assert info.value.url == f"{server.url}/v1/actions/generations"
    assert len(server.bodies) == 1


def test_error_after_last_retry_names_url_and_attempts(serve) -> None:
    server = serve(["drop", 500, "drop", "drop"])
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError, match=r"/v1/actions/generations: no answer after 3 attempt\(s\)"):
        _post(_client(server.url), PAYLOAD)
    assert len(server.bodies) == 3
    assert time.monotonic() - start >= 0.05 + 0.1  # exponential backoff between the attempts


def test_nothing_listening_and_dead_process(serve) -> None:
    server = serve([])
    url = server.url
    server.shutdown()
    server.server_close()
    with pytest.raises(ServerUnavailableError, match="ConnectError"):
        _post(_client(url, max_retries=1), PAYLOAD)
    # With an `alive` check that says the process is gone, the client stops after the first failure.
    start = time.monotonic()
    with pytest.raises(ServerDiedError, match="after 1 attempt"):
        _post(_client(url, max_retries=5, backoff_s=5.0, alive=lambda: False), PAYLOAD)
    assert time.monotonic() - start < 5.0


def test_json_encoding(serve) -> None:
    server = serve([])
    _post(_client(server.url, encoding="json"), PAYLOAD)
    assert codec.decode_json(server.bodies[0])["input"]["observation"]["image"] == np.zeros((1, 8, 8, 3)).tolist()
