"""N ranks of one Worker subclass as Ray actors: start, wire torch.distributed, call, gather, stop.

Results come back in rank order. Failures are collected as they happen (``ray.wait``), not in
rank order, so when rank 1 raises while rank 0 waits in a collective for it, the driver gets
rank 1's error and traceback at once instead of hanging until the collective times out.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlinf_cosmos3.cluster.cluster import Cluster
from rlinf_cosmos3.cluster.placement import PlacementPlan, bundle_node_ids, plan_placement, reserve
from rlinf_cosmos3.cluster.worker import GROUP_ENV, Worker, bind_rank

logger = logging.getLogger(__name__)

W = TypeVar("W", bound=Worker)


class WorkerError(RuntimeError):
    """A rank's method raised (or its actor died); carries the rank and the remote traceback."""

    def __init__(self, group: str, rank: int, method: str, cause: BaseException) -> None:
        self.group, self.rank, self.method, self.cause = group, rank, method, cause
        super().__init__(f"{group} rank {rank} failed in {method}():\n{cause}")


class WorkerGroup(Generic[W]):
    """Ranks ``0..num_ranks-1`` of ``worker_cls``, placed by :func:`plan_placement`.

    ``args``/``kwargs`` go to every rank's constructor. With ``init_distributed`` the group's
    default torch.distributed process group is ready when the constructor returns. Use as a
    context manager (or call :meth:`shutdown`) so actors and the placement group are freed.
    ``max_concurrency > 1`` makes each rank a threaded actor that runs up to that many calls at
    once (the worker must then guard its shared state); ``None`` keeps Ray's default, one call at
    a time for a synchronous worker.
    """

    def __init__(
        self,
        worker_cls: type[W],
        cluster: Cluster,
        num_ranks: int,
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        num_nodes: int = 1,
        gpus_per_rank: int = 0,
        cpus_per_rank: float = 1.0,
        custom_resources_per_rank: dict[str, float] | None = None,
        name: str | None = None,
        init_distributed: bool = True,
        backend: str | None = None,
        dist_timeout_s: float = 600.0,
        env_vars: dict[str, str] | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"worker_cls must be a Worker subclass, got {worker_cls!r}")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self._actor_options: dict[str, Any] = {} if max_concurrency is None else {"max_concurrency": max_concurrency}
        self.name = name or f"{worker_cls.__name__}-{uuid.uuid4().hex[:6]}"
        self.plan: PlacementPlan = plan_placement(
            cluster.resources(), num_ranks, num_nodes=num_nodes, gpus_per_rank=gpus_per_rank,
            cpus_per_rank=cpus_per_rank, custom_per_rank=custom_resources_per_rank,
        )
        self._actors: list[Any] = []
        self._inflight: list[ray.ObjectRef] = []
        self._pg: PlacementGroup | None = None
        self._distributed = False
        # Node id of each node rank (placement-group bundle), for logs and placement checks.
        self.node_ids: list[str] = []
        try:
            self._pg = reserve(self.plan, cluster.config.placement_timeout_s, name=self.name)
            self.node_ids = bundle_node_ids(self._pg)
            self._start_actors(worker_cls, tuple(args), dict(kwargs or {}), dict(env_vars or {}))
            if init_distributed:
                self.init_distributed(backend=backend, timeout_s=dist_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        logger.info("%s: %d rank(s) on %d node(s), %s", self.name, self.world_size, self.plan.num_nodes,
                    "GPU" if gpus_per_rank else "CPU")

    @classmethod
    def for_cluster(cls, worker_cls: type[W], cluster: Cluster, **options: Any) -> WorkerGroup[W]:
        """One rank per GPU (or ``num_cpu_ranks_per_node`` CPU ranks) on each configured node."""
        cfg = cluster.config
        return cls(worker_cls, cluster, cfg.world_size, num_nodes=cfg.num_nodes,
                   gpus_per_rank=1 if cfg.use_gpus else 0, cpus_per_rank=cfg.cpus_per_rank, **options)

    def _start_actors(self, worker_cls: type[W], args: tuple, kwargs: dict, env_vars: dict[str, str]) -> None:
        remote_cls = ray.remote(bind_rank(worker_cls))
        for p in self.plan.ranks:
            env = {**env_vars, GROUP_ENV: self.name, "RANK": str(p.rank), "WORLD_SIZE": str(self.world_size),
                   "LOCAL_RANK": str(p.local_rank), "LOCAL_WORLD_SIZE": str(self.plan.ranks_per_node),
                   "NODE_RANK": str(p.node_rank)}
            actor = remote_cls.options(
                num_cpus=self.plan.cpus_per_rank, num_gpus=self.plan.gpus_per_rank,
                resources=self.plan.custom_per_rank or None, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=p.node_rank),
                **self._actor_options,
            ).remote(env, *args, **kwargs)
            self._actors.append(actor)
        # Surfaces constructor errors (with rank) before anything else is asked of the ranks.
        self.call("node_info")

    def init_distributed(self, backend: str | None = None, timeout_s: float = 600.0) -> str:
        """Hand every rank rank 0's node IP and a free port there; join them all in one process group."""
        addr, port = self.call_rank(0, "find_master_address")
        backends = self.call("setup_distributed", addr, port, backend=backend, timeout_s=timeout_s)
        self._distributed = True
        return backends[0]

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def actors(self) -> list[Any]:
        """The ranks' Ray actor handles, in rank order."""
        return list(self._actors)

    def call_async(self, method: str, *args: Any, ranks: Sequence[int] | None = None,
                   **kwargs: Any) -> list[ray.ObjectRef]:
        """Start ``method(*args, **kwargs)`` on the given ranks (default all); return their ObjectRefs."""
        targets = range(self.world_size) if ranks is None else ranks
        refs = [getattr(self._actors[r], method).remote(*args, **kwargs) for r in targets]
        self._inflight = [ref for ref in self._inflight if not _is_done(ref)] + refs
        return refs

    def gather(self, refs: Sequence[ray.ObjectRef], ranks: Sequence[int] | None = None, method: str = "?",
               timeout_s: float | None = None) -> list[Any]:
        """Results of ``refs`` in their order; raise :class:`WorkerError` at the first rank that failed."""
        ranks = list(range(len(refs))) if ranks is None else list(ranks)
        rank_of = {ref: rank for ref, rank in zip(refs, ranks, strict=True)}
        pending = list(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                raise TimeoutError(f"{self.name}: {method}() did not finish on ranks "
                                   f"{sorted(rank_of[r] for r in pending)} within {timeout_s} s")
            try:
                ray.get(done[0])
            except (RayTaskError, RayActorError) as err:
                raise WorkerError(self.name, rank_of[done[0]], method, err) from None
        return ray.get(list(refs))

    def call(self, method: str, *args: Any, ranks: Sequence[int] | None = None, timeout_s: float | None = None,
             **kwargs: Any) -> list[Any]:
        """Run ``method`` on the given ranks (default all) and return the results in rank order."""
        targets = list(range(self.world_size)) if ranks is None else list(ranks)
        refs = self.call_async(method, *args, ranks=targets, **kwargs)
        return self.gather(refs, targets, method=method, timeout_s=timeout_s)

    def call_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on one rank and return its result."""
        return self.call(method, *args, ranks=[rank], **kwargs)[0]

    def shutdown(self, graceful_timeout_s: float = 10.0) -> None:
        """Destroy process groups, kill the actors, free the placement group (idempotent).

        Ranks that are still busy (e.g. stuck in a collective whose peer failed) cannot run the
        graceful teardown, so they are killed straight away.
        """
        actors, self._actors = self._actors, []
        if actors and self._distributed and not any(not _is_done(ref) for ref in self._inflight):
            refs = [a.teardown_distributed.remote() for a in actors]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=graceful_timeout_s)
            for ref in done:
                try:
                    ray.get(ref)
                except RayError as err:
                    logger.warning("%s: teardown_distributed failed: %s", self.name, err)
        self._inflight = []
        self._distributed = False
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
        if actors:
            logger.info("%s: shut down", self.name)

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()


def _is_done(ref: ray.ObjectRef) -> bool:
    done, _ = ray.wait([ref], timeout=0)
    return bool(done)
