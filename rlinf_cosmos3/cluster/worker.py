"""Base class of every rank: who am I, which device, and torch.distributed among the group.

WorkerGroup starts each rank as a Ray actor and, before the subclass ``__init__`` runs, puts
torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK) into the actor's
environment and tags the root logger with the rank, so a subclass knows its rank (and logs it)
from its first line. (Not via Ray's per-actor ``runtime_env``: that doubled actor start time.)
The driver later hands out MASTER_ADDR/MASTER_PORT (a free port on rank 0's node) and calls
:meth:`Worker.setup_distributed` on all ranks at once.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

GROUP_ENV = "RLINF_COSMOS3_GROUP"
LOG_LEVEL_ENV = "RLINF_COSMOS3_LOG_LEVEL"
# Matches the tag configure_rank_logging puts on every worker log line.
RANK_TAG_PATTERN = r"\[\S+ rank \d+/\d+\]"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def configure_rank_logging() -> None:
    """Prefix every log line of this process with its group and rank."""
    group = os.environ.get(GROUP_ENV, "worker")
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    logging.basicConfig(
        level=os.environ.get(LOG_LEVEL_ENV, "INFO").upper(),
        format=f"%(asctime)s [{group} rank {rank}/{world}] %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def bind_rank(worker_cls: type[Worker]) -> type[Worker]:
    """A subclass of ``worker_cls`` whose constructor first takes the rank's environment.

    Name, qualname and module are borrowed so Ray's log prefixes and tracebacks (and
    :attr:`Worker.logger`) show the worker's own name. cloudpickle still ships this class by value:
    looking the borrowed name up finds ``worker_cls``, not this class, which it treats as "not
    importable".
    """

    class RankBound(worker_cls):  # type: ignore[valid-type,misc]
        def __init__(self, rank_env: dict[str, str], *args: Any, **kwargs: Any) -> None:
            os.environ.update(rank_env)
            configure_rank_logging()
            super().__init__(*args, **kwargs)

    RankBound.__name__ = worker_cls.__name__
    RankBound.__qualname__ = worker_cls.__qualname__
    RankBound.__module__ = worker_cls.__module__
    return RankBound


class Worker:
    """One rank of a :class:`~rlinf_cosmos3.cluster.worker_group.WorkerGroup` (a Ray actor)."""

    @property
    def rank(self) -> int:
        return _env_int("RANK", 0)

    @property
    def world_size(self) -> int:
        return _env_int("WORLD_SIZE", 1)

    @property
    def local_rank(self) -> int:
        """Index of this rank among the ranks on its node."""
        return _env_int("LOCAL_RANK", 0)

    @property
    def local_world_size(self) -> int:
        return _env_int("LOCAL_WORLD_SIZE", 1)

    @property
    def node_rank(self) -> int:
        return _env_int("NODE_RANK", 0)

    @property
    def gpu_ids(self) -> list[str]:
        """GPUs Ray assigned to this rank (empty for a CPU rank)."""
        import ray

        if not ray.is_initialized():
            return []
        return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]

    @property
    def device(self) -> torch.device:
        """This rank's GPU if Ray assigned it one, else the CPU.

        Decided by Ray's assignment, not by ``torch.cuda.is_available()``: Ray leaves every GPU
        visible to an actor that asked for none, and a CPU rank on a GPU host must still use gloo.
        Ray sets CUDA_VISIBLE_DEVICES to the assigned GPU(s), so the rank's first GPU is always
        ``cuda:0`` inside the process, whatever its node-local index.
        """
        if self.gpu_ids and torch.cuda.is_available():
            return torch.device("cuda", 0)
        return torch.device("cpu")

    @property
    def logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)

    def node_info(self) -> dict[str, Any]:
        """Where this rank runs (node id, IP, pid, GPUs); used for placement checks and logs."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "rank": self.rank, "node_rank": self.node_rank, "local_rank": self.local_rank,
            "node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
            "gpu_ids": self.gpu_ids,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device": str(self.device),
        }

    def find_master_address(self) -> tuple[str, int]:
        """This node's IP and a port that is free on it now (asked of rank 0 by the driver)."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup_distributed(self, master_addr: str, master_port: int, backend: str | None = None,
                          timeout_s: float = 600.0) -> str:
        """Join the group's default process group (NCCL on GPU, gloo on CPU); return the backend."""
        backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        device_id = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            device_id = self.device
        host = f"[{master_addr}]" if ":" in master_addr else master_addr
        dist.init_process_group(
            backend=backend, init_method=f"tcp://{host}:{master_port}", rank=self.rank,
            world_size=self.world_size, timeout=timedelta(seconds=timeout_s), device_id=device_id,
        )
        self.logger.info("torch.distributed ready: backend %s, master %s:%d, device %s",
                         backend, master_addr, master_port, self.device)
        return backend

    def teardown_distributed(self) -> None:
        """Destroy the process group if this rank has one (safe to call twice)."""
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
