"""SGLangServerGroup with real ``sglang serve`` processes (CPU, the tiny random Cosmos3 model).

One module-wide group of two servers serves batched requests through the adapter, shows that the
adapter's token-length groups are exactly what the server batches, survives a ``kill -9`` of one
server (restart + retry of its in-flight requests, same answers as before) and finally is stopped
by an exception raised inside ``with group:`` (``__exit__`` -> ``close()``), leaving no process.
Short-lived groups check that a failed start (bogus model directory, health timeout) leaves
nothing behind and that start-up errors carry the server log's tail. Leftovers are searched by the tag every server process
(children included) carries in its environment, so other jobs' SGLang servers do not interfere.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from rlinf_cosmos3.actions import write_action_stats
from rlinf_cosmos3.config.rollout import RolloutModelConfig, SGLangConfig
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.validation.rollout import validate_rollout_model
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.http_client import ActionHTTPClient, ServerUnavailableError
from rlinf_cosmos3.workers.rollout.server_process import ServerStartError, tagged_processes
from rlinf_cosmos3.workers.rollout.sglang_group import SGLangServerGroup

pytestmark = [pytest.mark.slow, pytest.mark.sglang]

Q01 = [-0.5, -1.0, 0.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, 0.0]
Q99 = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]
SHORT_A = "pick up the black bowl"
SHORT_B = "pick up the black mug"  # same token length as SHORT_A
LONG = "pick up the alphabet soup and place it in the basket"
HEALTH_TIMEOUT_S = 400.0  # CPU servers on a busy 2-core box can take minutes to import


def _assert_nothing_left(tag: str) -> None:
    deadline = time.monotonic() + 10
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"


@pytest.fixture(scope="module")
def model_cfg(tmp_path_factory: pytest.TempPathFactory) -> RolloutModelConfig:
    root = tmp_path_factory.mktemp("sglang_rollout")
    model_dir = write_model_dir(root / "tiny", preset="tiny", seed=0)
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": Q01, "max": Q99, "q01": Q01, "q99": Q99}
    stats = write_action_stats({"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block},
                               root / "stats.json")
    return validate_rollout_model(RolloutModelConfig(model_path=str(model_dir), action_stats_path=str(stats),
                                                     action_normalization="quantile_rot", num_inference_steps=2))


def _sglang_cfg(**overrides) -> SGLangConfig:
    options = {"num_servers": 2, "gpus_per_server": 0, "batching_max_size": 4, "max_inflight_per_server": 2,
               "health_timeout_s": HEALTH_TIMEOUT_S, "http_timeout_s": 120.0, "http_max_retries": 3,
               "http_retry_backoff_s": 0.2, "max_restarts": 2, "base_port": 31000}
    return SGLangConfig(**{**options, **overrides})


@pytest.fixture(scope="module")
def group(model_cfg: RolloutModelConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServerGroup]:
    """Started here; the last test stops it by raising inside ``with group:`` (close() here is a no-op then)."""
    servers = SGLangServerGroup(model_cfg, _sglang_cfg(), log_dir=tmp_path_factory.mktemp("logs"))
    servers.start()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module")
def adapter(model_cfg: RolloutModelConfig) -> Cosmos3ActionAdapter:
    return Cosmos3ActionAdapter(model_cfg, batching_max_size=4)


def _obs(tasks: list[str], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = len(tasks)
    return {"main_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "task_descriptions": tasks}


def test_group_serves_batched_requests(group: SGLangServerGroup, adapter: Cosmos3ActionAdapter) -> None:
    assert len(group.urls) == 2 and len(set(group.urls)) == 2
    tasks = [SHORT_A, LONG, SHORT_B, SHORT_A, LONG, SHORT_B, SHORT_A]
    groups = adapter.request_groups(_obs(tasks))
    assert sorted(len(g) for g in groups) == [1, 2, 4]  # 5 short prompts -> 4 + 1, 2 long

    actions = asyncio.run(adapter.predict(_obs(tasks), group))

    assert actions.shape == (7, 16, 7) and actions.dtype == np.float32
    assert np.isfinite(actions).all()
    assert set(np.unique(actions[..., 6])) <= {-1.0, 1.0}
    assert (np.linalg.norm(actions[..., 3:6], axis=-1) <= np.pi + 1e-5).all()
    assert not np.allclose(actions[0], actions[1])
    # Three requests, at most two in flight per server, least-loaded first: both servers work.
    assert all(s["served"] >= 1 for s in group.stats()), group.stats()


def test_token_length_groups_are_what_the_server_batches(group: SGLangServerGroup,
                                                         adapter: Cosmos3ActionAdapter) -> None:
    obs = _obs([SHORT_A, SHORT_B, LONG])
    (same_length,) = [g for g in adapter.request_groups(obs) if len(g) == 2]
    mixed = adapter.build_request(same_length)
    mixed["input"]["task"] = [SHORT_A, LONG]
    client = ActionHTTPClient(group.urls[0], max_retries=0, timeout_s=120)

    async def go() -> None:
        try:
            answer = await client.post(adapter.build_request(same_length))
            assert np.asarray(answer["actions"]).shape == (2, 16, 10)
            with pytest.raises(ServerUnavailableError, match="HTTP 500"):
                await client.post(mixed)  # the server refuses prompts of unequal token length
        finally:
            await client.aclose()

    asyncio.run(go())


def test_a_group_attached_to_running_servers_serves_and_leaves_them_running(
        group: SGLangServerGroup, model_cfg: RolloutModelConfig, adapter: Cosmos3ActionAdapter, tmp_path: Path) -> None:
    """rollout.sglang.server_urls: the same dispatch over servers started elsewhere; nothing launched or stopped."""
    owner_pids = [server.pid for server in group.servers]
    first = group.servers[0].log_path.read_text().splitlines()[0]  # how to start such a server by hand
    assert first.startswith("# command: ") and " serve " in first and str(model_cfg.model_path) in first, first
    obs = _obs([SHORT_A, SHORT_B, LONG])
    attached = SGLangServerGroup(model_cfg, _sglang_cfg(server_urls=group.urls), log_dir=tmp_path)
    with attached:
        assert attached.urls == group.urls and not tagged_processes(attached.tag)  # nothing launched
        via_attached = asyncio.run(adapter.predict(obs, attached))
        assert sum(s["served"] for s in attached.stats()) == 2  # two prompt lengths -> two requests
    assert not (tmp_path / "sglang").exists() or not list((tmp_path / "sglang").iterdir())  # no server logs of ours
    assert [server.pid for server in group.servers] == owner_pids and all(psutil.pid_exists(p) for p in owner_pids)
    np.testing.assert_allclose(asyncio.run(adapter.predict(obs, group)), via_attached, atol=1e-5)  # same seed


def test_an_attached_server_that_is_down_or_stops_answering_is_an_error_naming_its_url(
        model_cfg: RolloutModelConfig, adapter: Cosmos3ActionAdapter, tmp_path: Path) -> None:
    """Fault injection: a health-only HTTP stand-in for a server someone else runs, then stopped."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class HealthOnly(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    stand_in = ThreadingHTTPServer(("127.0.0.1", 0), HealthOnly)
    url = f"http://127.0.0.1:{stand_in.server_address[1]}"
    thread = threading.Thread(target=stand_in.serve_forever, daemon=True)
    thread.start()
    quick = {"health_timeout_s": 2.0, "http_max_retries": 1, "http_retry_backoff_s": 0.1}
    group = SGLangServerGroup(model_cfg, _sglang_cfg(server_urls=[url], **quick), log_dir=tmp_path)
    try:
        group.start()
        stand_in.shutdown()
        stand_in.server_close()
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError, match=url):
            asyncio.run(adapter.predict(_obs([SHORT_A]), group))
        assert group.stats()[0]["restarts"] == 0 and time.monotonic() - start < 30
    finally:
        group.close()
        stand_in.server_close()
    down = SGLangServerGroup(model_cfg, _sglang_cfg(server_urls=[url], **quick), log_dir=tmp_path)
    start = time.monotonic()
    with pytest.raises(ServerStartError, match=f"{url} .*rollout.sglang.server_urls"):
        down.start()
    assert time.monotonic() - start < 30


def test_killed_server_is_restarted_and_requests_retried(group: SGLangServerGroup,
                                                         adapter: Cosmos3ActionAdapter) -> None:
    obs = _obs([SHORT_A, SHORT_B, SHORT_A, SHORT_B] * 3, seed=1)
    payloads = [adapter.build_request(g) for g in adapter.request_groups(obs)] * 2  # 6 requests of 4
    for payload in payloads:
        payload["parameters"]["num_inference_steps"] = 10  # keep requests in flight long enough to hit one
    victim = group.servers[0]
    old_pid = victim.pid
    assert old_pid is not None

    async def scenario() -> tuple[list[np.ndarray], list[np.ndarray]]:
        reference = await group.generate(payloads)
        slot = group._slots[0]
        task = asyncio.create_task(group.generate(payloads))
        while slot.inflight == 0:
            await asyncio.sleep(0.005)
        os.kill(old_pid, signal.SIGKILL)
        results = await task
        await group.wait_all_ready(HEALTH_TIMEOUT_S)
        return reference, results

    reference, results = asyncio.run(scenario())

    assert len(results) == len(payloads)
    for got, want in zip(results, reference, strict=True):
        assert got.shape == (4, 16, 10)
        np.testing.assert_array_equal(got, want)  # a retried request gives the same answer
    stats = group.stats()
    assert stats[0]["restarts"] == 1 and stats[0]["state"] == "ready", stats
    assert victim.pid not in (None, old_pid) and victim.alive()
    with pytest.raises(ProcessLookupError):
        os.killpg(old_pid, 0)  # the dead server's whole process group is gone
    # The restarted server answers.
    answer = asyncio.run(group.generate(payloads[:1]))
    np.testing.assert_array_equal(answer[0], reference[0])


def test_exception_inside_with_block_leaves_no_process(group: SGLangServerGroup) -> None:
    pids = [server.pid for server in group.servers]
    # Each server and the scheduler it forked carry the tag.
    assert len(tagged_processes(group.tag)) >= 2 * len(pids)
    with pytest.raises(RuntimeError, match="boom"), group:  # entering a started group does not restart it
        assert [server.pid for server in group.servers] == pids
        raise RuntimeError("boom")
    _assert_nothing_left(group.tag)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    group.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        group.start()


def test_start_failures_show_the_log_tail(model_cfg: RolloutModelConfig, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus_model"
    bogus.mkdir()
    (bogus / "model_index.json").write_text(json.dumps({"_class_name": "NoSuchPipeline"}))
    broken = SGLangServerGroup(RolloutModelConfig(model_path=str(bogus)), _sglang_cfg(num_servers=1),
                               log_dir=tmp_path / "bogus")
    # sglang takes an unknown model for a language model and rejects the diffusion server's flags.
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 2 .*last lines:\n.*unrecognized arguments"):
        broken.start()
    _assert_nothing_left(broken.tag)

    slow = SGLangServerGroup(model_cfg, _sglang_cfg(num_servers=1, health_timeout_s=2.0), log_dir=tmp_path / "slow")
    with pytest.raises(ServerStartError, match=r"not healthy after 2 s \(health_timeout_s\); log .*launch1\.log"):
        slow.start()
    _assert_nothing_left(slow.tag)


_DRIVER = """
import logging, sys, threading, time
from rlinf_cosmos3.config.rollout import RolloutModelConfig, SGLangConfig
from rlinf_cosmos3.workers.rollout.sglang_group import SGLangServerGroup

logging.basicConfig(level=logging.INFO)
mode, model_path, log_dir = sys.argv[1:4]
cfg = SGLangConfig(num_servers=1, gpus_per_server=0, health_timeout_s=600, base_port=31000)
group = SGLangServerGroup(RolloutModelConfig(model_path=model_path), cfg, log_dir=log_dir)
print(group.tag, flush=True)
if mode == "exit":  # the driver ends while its group is still starting in another thread
    threading.Thread(target=group.start, daemon=True).start()
    while not (group.servers and group.servers[0].pid):
        time.sleep(0.05)
    time.sleep(1.0)
    sys.exit(0)
group.start()  # signalled by the test while waiting for health
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "exit"])
def test_driver_signal_or_exit_stops_servers(model_cfg: RolloutModelConfig, tmp_path: Path, how: str) -> None:
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, how, model_cfg.model_path, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        tag = driver.stdout.readline().strip()
        assert tag.startswith("sglang-"), tag
        deadline = time.monotonic() + 120
        while not tagged_processes(tag):
            assert time.monotonic() < deadline and driver.poll() is None, driver.stdout.read()
            time.sleep(0.1)
        if how != "exit":
            driver.send_signal(getattr(signal, how))
        code = driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    output = driver.stdout.read()
    _assert_nothing_left(tag)
    if how == "SIGTERM":
        assert code == -signal.SIGTERM, output  # the default action still ends the driver
    elif how == "SIGINT":
        assert code != 0 and "KeyboardInterrupt" in output, output
    else:
        assert code == 0, output
    assert "SGLangServerGroup: 1 server(s) stopped" in output or "stopped (pid" in output, output
