"""SGLangServerGroup: N ``sglang serve`` processes (one per GPU) serving action requests over HTTP.

Start: every server is launched at once (own process group, ports reserved, log under
``<log_dir>/sglang/``), then all are health-polled together; one failing start stops them all and
raises with the failing server's log tail. Dispatch: each request goes to the least-loaded
healthy server (ties round-robin) with at most ``max_inflight_per_server`` requests on one server;
the batching is the client's (the adapter's) job, since the server does not merge concurrent
requests. Failure: when a server process dies, its in-flight requests get :class:`ServerDiedError`
from the HTTP client, the server is restarted in the background (up to ``max_restarts`` times) and
the requests are retried on whichever server is ready first. A server that is alive but keeps
failing (timeouts, 5xx after all retries) or rejects a request (4xx) is an error for the caller,
not a restart: restarting cannot fix a bad request. Stop: ``close()`` (also via ``with``, atexit,
SIGTERM/SIGINT, and on a failed start) stops every server's whole process group.

On one node servers are local subprocesses. With ``launch_via_ray`` each one is launched by an
:class:`~rlinf_cosmos3.workers.rollout.server_host.SGLangServerHost` actor on a GPU node instead.
With ``server_urls`` the group launches nothing and attaches to servers started elsewhere
(:mod:`~rlinf_cosmos3.workers.rollout.attached_server`): the same dispatch, no restart, no stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rlinf_cosmos3.config.rollout import RolloutModelConfig, SGLangConfig
from rlinf_cosmos3.workers.rollout import cleanup
from rlinf_cosmos3.workers.rollout.backend import RolloutBackend, RolloutBackendError
from rlinf_cosmos3.workers.rollout.http_client import ActionHTTPClient, ServerDiedError
from rlinf_cosmos3.workers.rollout.protocol import payload_images, response_actions
from rlinf_cosmos3.workers.rollout.server_process import ServerSpec, ServerStartError, SGLangServerProcess

if TYPE_CHECKING:
    from rlinf_cosmos3.cluster import Cluster, WorkerGroup

logger = logging.getLogger(__name__)

PORT_RACE_RETRIES = 3
READY, RESTARTING, FAILED = "ready", "restarting", "failed"


class ServerHandle(Protocol):
    """What the group needs of a server, local or hosted by a Ray actor."""

    rank: int

    @property
    def url(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    def launch(self) -> None: ...
    def alive(self) -> bool: ...
    async def wait_healthy(self, timeout_s: float) -> float: ...
    def port_race_lost(self) -> bool: ...
    def log_tail(self) -> str: ...
    def stop(self) -> None: ...


@dataclass
class _ServerSlot:
    """Dispatch state of one server."""

    server: ServerHandle
    client: ActionHTTPClient
    inflight: int = 0
    state: str = READY
    restarts: int = 0
    served: int = 0
    """Requests answered (for logs and tests of the dispatch)."""
    restart_task: asyncio.Task | None = None
    error: BaseException | None = None


def _visible_gpus() -> list[str] | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else [g.strip() for g in visible.split(",") if g.strip()]


class SGLangServerGroup(RolloutBackend):
    """See the module docstring."""

    def __init__(self, model_cfg: RolloutModelConfig, sglang_cfg: SGLangConfig, *, log_dir: str | Path,
                 cluster: Cluster | None = None) -> None:
        self.model_cfg = model_cfg
        self.cfg = sglang_cfg.validate()
        self.log_dir = Path(log_dir) / "sglang"
        self.cluster = cluster
        if self.cfg.launch_via_ray and cluster is None:
            raise ValueError("rollout.sglang.launch_via_ray needs the run's Cluster")
        self._servers: list[ServerHandle] = []
        self._slots: list[_ServerSlot] = []
        self._hosts: WorkerGroup | None = None
        self._cond: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next = 0
        self._closed = False
        self.tag = f"sglang-{uuid.uuid4().hex[:8]}"
        """Marks this group's server processes (``server_process.SERVER_TAG_ENV``)."""

    @property
    def max_batch_size(self) -> int:
        return self.cfg.batching_max_size

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self._servers]

    @property
    def servers(self) -> list[ServerHandle]:
        return list(self._servers)

    def stats(self) -> list[dict[str, Any]]:
        """Per server: url, state, requests served and restarts so far."""
        return [{"rank": s.server.rank, "url": s.server.url, "state": s.state, "served": s.served,
                 "restarts": s.restarts} for s in self._slots]

    # ------------------------------------------------------------------ start / stop

    def _spec(self, rank: int) -> ServerSpec:
        cfg = self.cfg
        gpu_ids: list[str] | None = None
        if cfg.gpus_per_server > 0:
            ids = cfg.gpu_ids if cfg.gpu_ids is not None else list(range(cfg.num_servers * cfg.gpus_per_server))
            mine = ids[rank * cfg.gpus_per_server:(rank + 1) * cfg.gpus_per_server]
            visible = _visible_gpus()  # config ids index the driver's visible devices
            gpu_ids = [visible[i] if visible else str(i) for i in mine]
        return ServerSpec(
            model_path=str(Path(self.model_cfg.model_path).resolve()), python=str(cfg.interpreter),
            script=str(cfg.sglang_script), log_dir=str(self.log_dir), host=cfg.host, base_port=cfg.base_port,
            batching_max_size=cfg.batching_max_size, sleep_on_idle=cfg.sleep_on_idle, warmup_mode=cfg.warmup_mode,
            gpu_ids=gpu_ids, extra_args=list(cfg.extra_server_args), stop_timeout_s=cfg.stop_timeout_s,
            tag=self.tag,
        )

    def _make_servers(self) -> list[ServerHandle]:
        if self.cfg.attaches:
            from rlinf_cosmos3.workers.rollout.attached_server import AttachedServer

            return [AttachedServer(url, rank) for rank, url in enumerate(self.cfg.server_urls or [])]
        if not self.cfg.launch_via_ray:
            return [SGLangServerProcess(self._spec(rank), rank) for rank in range(self.cfg.num_servers)]
        from rlinf_cosmos3.cluster import WorkerGroup
        from rlinf_cosmos3.workers.rollout.server_host import RayServerHandle, SGLangServerHost

        assert self.cluster is not None
        # Every rank gets the same spec; the actor swaps in the GPUs Ray gave it.
        spec = self._spec(0)
        self._hosts = WorkerGroup(SGLangServerHost, self.cluster, self.cfg.num_servers, args=(spec,),
                                  num_nodes=self.cluster.config.num_nodes, gpus_per_rank=self.cfg.gpus_per_server,
                                  name="SGLangServerGroup", init_distributed=False)
        return [RayServerHandle(actor, rank) for rank, actor in enumerate(self._hosts.actors)]

    def _client(self, server: ServerHandle) -> ActionHTTPClient:
        """A client bound to the server's current launch: once it is relaunched, this one reports it dead."""
        cfg = self.cfg
        pid = server.pid

        def alive() -> bool:
            return server.pid == pid and server.alive()

        # A server we attached to has no process to watch: it never counts as died (no restart), and
        # one that stops answering raises ServerUnavailableError naming its URL after the retries.
        return ActionHTTPClient(server.url, timeout_s=cfg.http_timeout_s, max_retries=cfg.http_max_retries,
                                backoff_s=cfg.http_retry_backoff_s, backoff_max_s=cfg.http_retry_backoff_max_s,
                                encoding=cfg.encoding, alive=None if cfg.attaches else alive)

    def start(self) -> None:
        """Launch all servers and wait until every one is healthy (sync; see :meth:`astart`).

        A no-op on a running group (so ``with group:`` works on a started one); a closed group
        cannot be started again.
        """
        if self._servers and not self._closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.astart())
            return
        raise RuntimeError("SGLangServerGroup.start() called inside an event loop; use `await group.astart()`")

    async def astart(self) -> None:
        if self._closed:
            raise RuntimeError("SGLangServerGroup was closed; make a new one")
        if self._servers:
            return
        cleanup.register(self)
        try:
            self._servers = self._make_servers()
            for server in self._servers:
                await asyncio.to_thread(server.launch)
            await asyncio.gather(*(self._until_healthy(server) for server in self._servers))
            self._slots = [_ServerSlot(server, self._client(server)) for server in self._servers]
            for server in self._servers:
                logger.info("sglang server assigned: rank=%d -> %s (%d server(s)%s)", server.rank, server.url,
                            len(self._servers), ", attached: not ours to restart or stop" if self.cfg.attaches else "")
        except BaseException:
            self.close()
            raise

    async def _until_healthy(self, server: ServerHandle) -> None:
        """Wait for health; relaunch on fresh ports when another process took a reserved one first."""
        for attempt in range(1, PORT_RACE_RETRIES + 1):
            try:
                took = await server.wait_healthy(self.cfg.health_timeout_s)
            except ServerStartError:
                if attempt < PORT_RACE_RETRIES and await asyncio.to_thread(server.port_race_lost):
                    logger.warning("sglang server rank %d lost a port race; relaunching", server.rank)
                    await asyncio.to_thread(server.launch)
                    continue
                raise
            logger.info("sglang server rank %d healthy after %.1f s at %s", server.rank, took, server.url)
            return

    def close(self) -> None:
        """Stop every server's process group (idempotent; also runs at exit and on SIGTERM/SIGINT)."""
        self._closed = True
        servers, self._servers = self._servers, []
        slots, self._slots = self._slots, []
        cleanup.unregister(self)
        for slot in slots:
            if slot.restart_task is not None and not slot.restart_task.done():
                slot.restart_task.cancel()
        for server in servers:
            try:
                server.stop()
            except Exception:  # keep stopping the other servers
                logger.exception("stopping sglang server rank %d failed", server.rank)
        if self._hosts is not None:
            hosts, self._hosts = self._hosts, None
            hosts.shutdown()
        if servers:
            logger.info("SGLangServerGroup: %d server(s) %s", len(servers),
                        "detached (left running: started elsewhere)" if self.cfg.attaches else "stopped")

    # ------------------------------------------------------------------ dispatch

    def _condition(self) -> asyncio.Condition:
        """The dispatch condition of the running loop (asyncio primitives cannot cross loops)."""
        loop = asyncio.get_running_loop()
        if self._cond is None or self._loop is not loop:
            self._cond, self._loop = asyncio.Condition(), loop
            for slot in self._slots:
                slot.inflight = 0
                slot.restart_task = None
        return self._cond

    async def _acquire(self) -> _ServerSlot:
        cond = self._condition()
        async with cond:
            while True:
                if not self._slots:
                    raise RolloutBackendError("SGLangServerGroup is not started (or already closed)")
                self._resume_restarts()
                ready = [s for s in self._slots if s.state == READY and s.inflight < self.cfg.max_inflight_per_server]
                if ready:
                    n = len(self._slots)
                    slot = min(ready, key=lambda s: (s.inflight, (s.server.rank - self._next) % n))
                    self._next = (slot.server.rank + 1) % n
                    slot.inflight += 1
                    return slot
                if all(s.state == FAILED for s in self._slots):
                    errors = "; ".join(f"rank {s.server.rank}: {s.error}" for s in self._slots)
                    raise RolloutBackendError(f"every sglang server failed: {errors}")
                await cond.wait()

    def _resume_restarts(self) -> None:
        """Restart again what a previous event loop left half-restarted (its task died with the loop)."""
        for slot in self._slots:
            if slot.state == RESTARTING and slot.restart_task is None:
                slot.restart_task = asyncio.create_task(self._restart(slot))

    async def _release(self, slot: _ServerSlot) -> None:
        cond = self._condition()
        async with cond:
            slot.inflight = max(0, slot.inflight - 1)
            cond.notify_all()

    async def _server_died(self, slot: _ServerSlot, client: ActionHTTPClient, err: ServerDiedError) -> None:
        cond = self._condition()
        async with cond:
            if slot.state == READY and slot.client is client:  # not yet handled by another request
                logger.warning("sglang server rank %d (%s) died: %s", slot.server.rank, slot.server.url, err)
                slot.state = RESTARTING
                slot.restart_task = asyncio.create_task(self._restart(slot))

    async def _restart(self, slot: _ServerSlot) -> None:
        server = slot.server
        try:
            if slot.restarts >= self.cfg.max_restarts:
                raise RolloutBackendError(f"sglang server rank {server.rank} died {slot.restarts + 1} times "
                                          f"(max_restarts={self.cfg.max_restarts}); log tail:\n{server.log_tail()}")
            slot.restarts += 1
            logger.warning("restarting sglang server rank %d (restart %d/%d)", server.rank, slot.restarts,
                           self.cfg.max_restarts)
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.launch)
            if self._closed:  # close() ran meanwhile and may have missed this launch
                await asyncio.to_thread(server.stop)
                return
            await self._until_healthy(server)
            slot.client = self._client(server)
            slot.state = READY
            logger.info("sglang server assigned: rank=%d -> %s (restarted)", server.rank, server.url)
        except asyncio.CancelledError:  # the event loop ended mid-restart; the next loop redoes it
            slot.restarts -= 1
            raise
        except (RuntimeError, OSError, TimeoutError) as err:  # ServerStartError, RolloutBackendError, Popen
            logger.error("sglang server rank %d could not be restarted: %s", server.rank, err)
            slot.state, slot.error = FAILED, err
            await asyncio.to_thread(server.stop)
        finally:
            cond = self._condition()
            async with cond:
                cond.notify_all()

    async def _generate_one(self, payload: Mapping[str, Any]) -> np.ndarray:
        batch = len(payload_images(payload))
        if batch > self.max_batch_size:
            raise ValueError(f"a request of {batch} images exceeds batching_max_size={self.max_batch_size}")
        while True:
            slot = await self._acquire()
            client = slot.client
            try:
                response = await client.post(payload)
            except ServerDiedError as err:
                await self._server_died(slot, client, err)
                continue  # retried on whichever server is ready first (maybe the restarted one)
            finally:
                await self._release(slot)
            slot.served += 1
            return response_actions(response, batch, payload.get("parameters"))

    async def wait_all_ready(self, timeout_s: float | None = None) -> None:
        """Wait until no server is restarting (restarts run in the background of ``generate``)."""
        cond = self._condition()

        def settled() -> bool:
            self._resume_restarts()
            return all(slot.state != RESTARTING for slot in self._slots)

        async with cond:
            await asyncio.wait_for(cond.wait_for(settled), timeout_s)

    async def generate(self, payloads: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        """Serve ``payloads`` concurrently across the servers; results in payload order."""
        return list(await asyncio.gather(*(self._generate_one(p) for p in payloads)))
