"""Start or join Ray, report what it offers, and shut down only what we started.

A run either owns a private local Ray (``address: null``; stopped on exit, also via atexit, and by
:mod:`~rlinf_cosmos3.cluster.reaper` when the driver is killed outright) or joins a running cluster
(``auto`` / ``ip:port``), which only disconnects on exit so the cluster and other jobs on it keep running. Worker actors and placement groups a run creates belong to
its driver; Ray frees them when the driver disconnects, and WorkerGroup also removes them itself.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from types import TracebackType

import ray

from rlinf_cosmos3.cluster.reaper import DRIVER_ENV
from rlinf_cosmos3.cluster.worker import RANK_TAG_PATTERN
from rlinf_cosmos3.config.cluster import ClusterConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeResources:
    """One alive Ray node and its total resources."""

    node_id: str
    ip: str
    cpus: float
    gpus: float
    is_head: bool
    # Custom resources (e.g. a label resource given with ``ray start --resources``).
    custom: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterResources:
    """Totals over the alive nodes, in a stable order (head first, then by IP and node id)."""

    nodes: tuple[NodeResources, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def total_cpus(self) -> float:
        return sum(node.cpus for node in self.nodes)

    @property
    def total_gpus(self) -> float:
        return sum(node.gpus for node in self.nodes)

    def __str__(self) -> str:
        per_node = ", ".join(f"{n.ip} ({n.cpus:g} CPU, {n.gpus:g} GPU)" for n in self.nodes)
        return (f"{self.num_nodes} node(s), {self.total_cpus:g} CPUs, {self.total_gpus:g} GPUs"
                f" [{per_node}]")


# Keys of ray.nodes()["Resources"] that are bookkeeping, not resources a rank can ask for.
_BUILTIN_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}


def current_resources() -> ClusterResources:
    """Read the alive nodes from the connected Ray."""
    nodes = []
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        res: dict[str, float] = info.get("Resources", {})
        custom = {k: v for k, v in res.items()
                  if k not in _BUILTIN_RESOURCES and not k.startswith("node:") and not k.startswith("accelerator_type:")}
        nodes.append(NodeResources(
            node_id=info["NodeID"], ip=info["NodeManagerAddress"], cpus=res.get("CPU", 0.0),
            gpus=res.get("GPU", 0.0), is_head="node:__internal_head__" in res, custom=custom,
        ))
    nodes.sort(key=lambda n: (not n.is_head, n.ip, n.node_id))
    return ClusterResources(tuple(nodes))


def _never_dedup_rank_lines() -> None:
    """Show every rank's log lines on the driver.

    Ray's driver merges worker log lines that differ only in words containing digits -- which is
    exactly what rank tags are -- into one "[repeated Nx across cluster]" line. Its public switch
    (RAY_DEDUP_LOGS=0) is read when ray is imported, too early for a config; so rank-tagged lines
    are added to the deduplicators' allow-pattern instead (a private attribute: if a Ray version
    lacks it, lines are merely deduplicated again).
    """
    from ray._private import ray_logging

    for name in ("stdout_deduplicator", "stderr_deduplicator"):
        dedup = getattr(ray_logging, name, None)
        if dedup is None or not hasattr(dedup, "allow_re"):
            logger.debug("Ray has no %s; rank log lines may be deduplicated on the driver", name)
            continue
        old = dedup.allow_re.pattern if dedup.allow_re is not None else None
        if old is None or RANK_TAG_PATTERN not in old:
            dedup.allow_re = re.compile(RANK_TAG_PATTERN if old is None else f"{RANK_TAG_PATTERN}|{old}")


def _keep_sigterm_in_python() -> None:
    """Give SIGTERM back to Python's handler after Ray's core worker took it over.

    ``ray.init`` installs a C-level failure handler (absl) for SIGTERM that prints a stack dump,
    arms a 3 s alarm and then calls Python's handler; the alarm is never cancelled, so a driver
    whose cleanup (stopping Ray, servers, writers) outlasts 3 s is aborted half-way (SIGABRT,
    seen on a busy 2-core machine). Re-installing the current Python handler replaces the C-level
    one for SIGTERM only; crash signals (SIGSEGV, SIGABRT, ...) keep Ray's stack dumps.
    """
    current = signal.getsignal(signal.SIGTERM)
    if current is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, current)


LOCAL_START_WAIT_S = 120


class Cluster:
    """The run's connection to Ray; use as a context manager or call :meth:`shutdown`."""

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = (config or ClusterConfig()).validate()
        self._owns_ray = False
        self._connected = False
        self._reaper: subprocess.Popen | None = None
        self._previous_token: str | None = None
        if ray.is_initialized():
            # Someone (a notebook, a test harness) already connected this process; reuse it and
            # leave its lifetime to them.
            logger.warning("Ray is already initialised in this process; reusing it (it will not be shut down here)")
        else:
            if self.config.address is None:
                # Ray's 10 s default for the raylet to register is too short on a small, busy machine
                # (2 cores running simulators): give a local start more time unless the user chose.
                os.environ.setdefault("RAY_raylet_start_wait_time_s", str(LOCAL_START_WAIT_S))
                self._start_reaper()  # before Ray: its processes inherit the token
            try:
                ray.init(**self._init_kwargs())
            except BaseException:
                self._stop_reaper()
                raise
            self._owns_ray = self.config.address is None
            self._connected = True
            if self._owns_ray:
                atexit.register(self.shutdown)
            _keep_sigterm_in_python()
        if self.config.log_to_driver:
            _never_dedup_rank_lines()
        how = "started locally" if self._owns_ray else f"joined at {self.config.address or 'existing connection'}"
        logger.info("Ray %s (namespace %s): %s", how, ray.get_runtime_context().namespace, self.resources())

    def _start_reaper(self) -> None:
        """Tag everything started from now on and have :mod:`~rlinf_cosmos3.cluster.reaper` stop it should this
        process be killed outright (then nothing of ours runs: no atexit, no signal handler)."""
        self._previous_token = os.environ.get(DRIVER_ENV)
        token = f"{os.getpid()}:{uuid.uuid4().hex[:12]}"
        os.environ[DRIVER_ENV] = token
        self._reaper = subprocess.Popen([sys.executable, "-m", "rlinf_cosmos3.cluster.reaper", str(os.getpid()), token],
                                        start_new_session=True, stdin=subprocess.DEVNULL)

    def _stop_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is None:
            return
        reaper.terminate()
        try:
            reaper.wait(timeout=10)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()
        if self._previous_token is None:
            os.environ.pop(DRIVER_ENV, None)
        else:
            os.environ[DRIVER_ENV] = self._previous_token

    def _init_kwargs(self) -> dict:
        cfg = self.config
        kwargs: dict = {"namespace": cfg.namespace, "log_to_driver": cfg.log_to_driver}
        if cfg.address is not None:
            kwargs["address"] = cfg.address
            return kwargs
        # "local" forces a new private Ray even when RAY_ADDRESS or a running cluster exists.
        kwargs.update(address="local", include_dashboard=cfg.include_dashboard, num_cpus=cfg.num_cpus,
                      num_gpus=cfg.num_gpus)
        if cfg.object_store_memory_mb is not None:
            kwargs["object_store_memory"] = cfg.object_store_memory_mb * 1024 * 1024
        if cfg.temp_dir is not None:
            kwargs["_temp_dir"] = cfg.temp_dir
        return kwargs

    @property
    def owns_ray(self) -> bool:
        """True when this Cluster started Ray itself (and so stops it on shutdown)."""
        return self._owns_ray

    def resources(self) -> ClusterResources:
        return current_resources()

    def shutdown(self) -> None:
        """Disconnect; a Ray started here is stopped with its processes, a joined one keeps running."""
        if not self._connected:
            return
        self._connected = False
        if self._owns_ray:
            atexit.unregister(self.shutdown)
        if ray.is_initialized():
            ray.shutdown()
        self._stop_reaper()
        logger.info("Ray %s", "stopped" if self._owns_ray else "disconnected (cluster left running)")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()
