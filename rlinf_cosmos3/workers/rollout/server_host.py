"""Launching SGLang servers from Ray actors placed on the GPU nodes (multi-node evaluation).

On one node the group starts its servers as local subprocesses. Across nodes a server has to
start on the node that owns its GPUs, so :class:`SGLangServerHost` — a
:class:`~rlinf_cosmos3.cluster.Worker` placed by a :class:`~rlinf_cosmos3.cluster.WorkerGroup`
with ``gpus_per_rank = gpus_per_server`` — owns one :class:`SGLangServerProcess` there. Ray's
CUDA_VISIBLE_DEVICES for the actor becomes the server's, and the server advertises the node's IP
(bind it to ``0.0.0.0`` or that IP so the driver can reach it). :class:`RayServerHandle` gives the
group the same methods as a local server process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import ray

from rlinf_cosmos3.cluster import Worker
from rlinf_cosmos3.workers.rollout.server_process import ServerSpec, SGLangServerProcess


class SGLangServerHost(Worker):
    """One rank = one ``sglang serve`` on this actor's node and GPUs."""

    def __init__(self, spec: ServerSpec) -> None:
        if spec.gpu_ids is not None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            spec = dataclasses.replace(spec, gpu_ids=[g for g in visible.split(",") if g])
        self.server = SGLangServerProcess(spec, self.rank, advertise_host=ray.util.get_node_ip_address())

    def launch(self) -> str:
        self.server.launch()
        return self.server.url

    def url(self) -> str:
        return self.server.url

    def pid(self) -> int | None:
        return self.server.pid

    def alive(self) -> bool:
        return self.server.alive()

    def wait_healthy(self, timeout_s: float) -> float:
        return asyncio.run(self.server.wait_healthy(timeout_s))

    def port_race_lost(self) -> bool:
        return self.server.port_race_lost()

    def log_tail(self) -> str:
        return self.server.log_tail()

    def stop(self) -> None:
        self.server.stop()


class RayServerHandle:
    """The group's view of a server hosted by an :class:`SGLangServerHost` actor."""

    def __init__(self, actor: Any, rank: int) -> None:
        self.actor = actor
        self.rank = rank
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            self._url = ray.get(self.actor.url.remote())
        return self._url

    @property
    def pid(self) -> int | None:
        return ray.get(self.actor.pid.remote())

    def launch(self) -> None:
        self._url = ray.get(self.actor.launch.remote())

    def alive(self) -> bool:
        return bool(ray.get(self.actor.alive.remote()))

    async def wait_healthy(self, timeout_s: float) -> float:
        return await self.actor.wait_healthy.remote(timeout_s)

    def port_race_lost(self) -> bool:
        return bool(ray.get(self.actor.port_race_lost.remote()))

    def log_tail(self) -> str:
        return ray.get(self.actor.log_tail.remote())

    def stop(self) -> None:
        ray.get(self.actor.stop.remote())
