"""The real SGLang server (``.venv-sglang``) serves the tiny model's LIBERO action endpoint.

One server for the module: started in its own process group, health-polled, asked for actions
in JSON and msgpack for one image and a batch of two, then stopped with its whole group
(SIGTERM, then SIGKILL) — also when a test fails. The production launcher (SGLangServerGroup)
is separate; this helper is only what the tests need.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from rlinf_cosmos3.models.cosmos3 import (
    ACTION_HORIZON,
    LIBERO_DOMAIN_ID,
    LIBERO_DOMAIN_NAME,
    LIBERO_RAW_ACTION_DIM,
)
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.paths import sglang_python
from rlinf_cosmos3.procgroup import group_alive

pytestmark = [pytest.mark.slow, pytest.mark.sglang]

READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 15.0
PROMPT = "pick up the black bowl and place it on the plate"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]



class _Server:
    """`sglang serve` in its own process group; ``stop`` is idempotent and kills the whole group."""

    def __init__(self, model_dir: Path, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "sglang.log"
        sglang = sglang_python().parent / "sglang"
        cmd = [str(sglang), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--batching-max-size", "4", "--warmup-mode", "off", "--sleep-on-idle"]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pgid = self.proc.pid  # start_new_session: the child leads its own group

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_ready(self) -> float:
        start = time.monotonic()
        while time.monotonic() - start < READY_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"sglang not healthy after {READY_TIMEOUT_S:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if group_alive(self.pgid):
            os.killpg(self.pgid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                time.sleep(0.2)
            if group_alive(self.pgid):
                os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(timeout=30)  # reap the leader so it no longer counts as a group member
        deadline = time.monotonic() + 10
        while group_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.2)  # children reparented to init are reaped there


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    if not sglang_python().is_file():
        pytest.fail(f"SGLang environment missing: {sglang_python()} (run requirements/install.sh)")
    root = tmp_path_factory.mktemp("sglang")
    model_dir = write_model_dir(root / "tiny", preset="tiny", seed=0)
    srv = _Server(model_dir, root)
    try:
        srv.ready_s = srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _observation(seed: int) -> np.ndarray:
    """A LIBERO-shaped policy input: two 256x256 views side by side, uint8 HWC."""
    return np.random.default_rng(seed).integers(0, 256, size=(256, 512, 3), dtype=np.uint8)


def _payload(images: np.ndarray, encoding: str, response_format: str, seed: int = 0) -> dict[str, Any]:
    """The action request of docs/rollout.md; a batch is one [B,H,W,C] array (msgpack) or a list of images (JSON)."""
    if encoding == "json":
        image: Any = [img.tolist() for img in images]  # a list of images, even for one
    else:
        image = images if len(images) > 1 else images[0]
    return {
        "input": {"task": PROMPT, "observation": {"image": image}},
        "parameters": {
            "action_mode": "policy",
            "domain_name": LIBERO_DOMAIN_NAME,
            "raw_action_dim": LIBERO_RAW_ACTION_DIM,
            "action_horizon": ACTION_HORIZON,
            "num_inference_steps": 2,
            "height": 192,
            "width": 320,
            "fps": 20,
            "seed": seed,
        },
        "runtime": {"response_format": response_format},
    }


def _pack(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": True, "data": obj.tobytes(), "dtype": obj.dtype.str, "shape": list(obj.shape)}
    return obj


def _unpack(obj: dict) -> Any:
    """The server packs arrays with *bytes* keys (b"__ndarray__", b"data", ...): accept both."""

    def get(key: str) -> Any:
        return obj.get(key, obj.get(key.encode()))

    if get("__ndarray__"):
        return np.ndarray(buffer=get("data"), dtype=np.dtype(get("dtype")), shape=tuple(get("shape")))
    return obj


def _post(url: str, payload: dict[str, Any], encoding: str) -> dict[str, Any]:
    endpoint = f"{url}/v1/actions/generations"
    if encoding == "json":
        response = httpx.post(endpoint, json=payload, timeout=120)
        response.raise_for_status()
        return response.json()
    body = msgpack.packb(payload, default=_pack, use_bin_type=True)
    headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
    response = httpx.post(endpoint, content=body, headers=headers, timeout=120)
    response.raise_for_status()
    assert response.headers["content-type"].startswith("application/msgpack")
    return msgpack.unpackb(response.content, object_hook=_unpack, raw=False)


def _actions(response: dict[str, Any], response_format: str) -> np.ndarray:
    """``[B, 16, 10]`` from either response shape, checking the envelope's bookkeeping."""
    if response_format == "raw":
        assert response["raw_action_dim"] == LIBERO_RAW_ACTION_DIM
        return np.asarray(response["actions"], dtype=np.float32)
    assert response["object"] == "action.generation"
    data = sorted(response["data"], key=lambda item: item["input_index"])
    assert [item["input_index"] for item in data] == list(range(len(data)))
    for item in data:
        action = item["action"]
        assert action["shape"] == [ACTION_HORIZON, LIBERO_RAW_ACTION_DIM]
        assert (action["domain_id"], action["raw_action_dim"]) == (LIBERO_DOMAIN_ID, LIBERO_RAW_ACTION_DIM)
    return np.stack([np.asarray(item["action"]["values"], dtype=np.float32) for item in data])


def test_server_is_healthy(server: _Server) -> None:
    assert server.ready_s < READY_TIMEOUT_S
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@pytest.mark.parametrize("batch", [1, 2])
def test_policy_actions(server: _Server, encoding: str, batch: int) -> None:
    images = np.stack([_observation(i) for i in range(batch)])
    envelope = _actions(_post(server.url, _payload(images, encoding, "envelope"), encoding), "envelope")
    raw = _actions(_post(server.url, _payload(images, encoding, "raw"), encoding), "raw")
    expected = (batch, ACTION_HORIZON, LIBERO_RAW_ACTION_DIM)
    if batch == 1 and raw.ndim == 2:
        raw = raw[None]
    assert envelope.shape == expected and raw.shape == expected
    assert np.isfinite(envelope).all() and np.abs(envelope).max() > 0
    # Same request and seed -> same actions, whichever response shape carries them.
    np.testing.assert_array_equal(envelope, raw)
    if batch == 2:
        assert not np.allclose(envelope[0], envelope[1]), "two different observations gave one action"


def test_seed_changes_actions_and_json_matches_msgpack(server: _Server) -> None:
    images = _observation(0)[None]
    by_json = _actions(_post(server.url, _payload(images, "json", "raw", seed=7), "json"), "raw")
    by_msgpack = _actions(_post(server.url, _payload(images, "msgpack", "raw", seed=7), "msgpack"), "raw")
    other_seed = _actions(_post(server.url, _payload(images, "json", "raw", seed=8), "json"), "raw")
    np.testing.assert_array_equal(by_json, by_msgpack)
    assert not np.allclose(by_json, other_seed)


def test_stop_leaves_no_process(server: _Server) -> None:
    server.stop()
    assert server.proc.returncode is not None
    assert not group_alive(server.pgid), f"processes left in group {server.pgid}"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/health", timeout=2)
