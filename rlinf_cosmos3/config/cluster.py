"""The ``cluster:`` section of a run config: where Ray runs and how many ranks it hosts.

One rank per GPU when ``num_gpus_per_node > 0`` (NCCL); otherwise ``num_cpu_ranks_per_node``
CPU ranks per node (gloo), which is how tests and CPU smoke runs train.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_cosmos3.config.base import require

# Ray refuses object stores below 75 MiB; say so before ray.init does, with the field name.
MIN_OBJECT_STORE_MB = 75


@dataclass
class ClusterConfig:
    """Where Ray runs and how the training ranks are laid out on it."""

    # None starts a private local Ray (shut down on exit); "auto" or "ip:port" joins a running
    # cluster, which is left running.
    address: str | None = None
    namespace: str = "rlinf_cosmos3"
    num_nodes: int = 1
    # GPUs used on each node, one rank per GPU. 0 runs the ranks on CPU with gloo.
    num_gpus_per_node: int = 0
    # Ranks per node when num_gpus_per_node is 0.
    num_cpu_ranks_per_node: int = 1
    # CPU cores reserved per rank (Ray bookkeeping; also Ray's default OMP_NUM_THREADS).
    cpus_per_rank: float = 1.0
    # Forward worker stdout/stderr (our rank-tagged log lines) to the driver's console.
    log_to_driver: bool = True
    # The following only apply when Ray is started locally (address is None).
    num_cpus: int | None = None
    # GPUs the local Ray may hand out (None: all it detects; 0: a CPU-only run on a GPU host).
    num_gpus: int | None = None
    object_store_memory_mb: int | None = None
    include_dashboard: bool = False
    # Ray's session/socket directory; keep it short (unix socket paths are limited to 107 bytes).
    temp_dir: str | None = None
    # Seconds to wait for Ray to reserve the ranks' resources before giving up with an error.
    placement_timeout_s: float = 120.0

    @property
    def use_gpus(self) -> bool:
        return self.num_gpus_per_node > 0

    @property
    def ranks_per_node(self) -> int:
        return self.num_gpus_per_node if self.use_gpus else self.num_cpu_ranks_per_node

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    def validate(self, root: str = "cluster") -> ClusterConfig:
        """Check values that Ray would reject later with a less helpful message."""
        require(self.address is None or self.address.strip() != "", f"{root}.address", "is empty",
                "leave it unset (null) for a local Ray, or use 'auto' / 'ip:port' to join one")
        require(self.num_nodes >= 1, f"{root}.num_nodes", f"must be >= 1, got {self.num_nodes}")
        require(self.num_gpus_per_node >= 0, f"{root}.num_gpus_per_node",
                f"must be >= 0, got {self.num_gpus_per_node}", "use 0 to run on CPU")
        require(self.num_cpu_ranks_per_node >= 1, f"{root}.num_cpu_ranks_per_node",
                f"must be >= 1, got {self.num_cpu_ranks_per_node}")
        require(self.cpus_per_rank > 0, f"{root}.cpus_per_rank", f"must be > 0, got {self.cpus_per_rank}")
        require(self.placement_timeout_s > 0, f"{root}.placement_timeout_s",
                f"must be > 0, got {self.placement_timeout_s}")
        if self.object_store_memory_mb is not None:
            require(self.object_store_memory_mb >= MIN_OBJECT_STORE_MB, f"{root}.object_store_memory_mb",
                    f"Ray needs at least {MIN_OBJECT_STORE_MB} MB, got {self.object_store_memory_mb}")
        if self.address is not None:
            local_only = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                          "object_store_memory_mb": self.object_store_memory_mb,
                          "temp_dir": self.temp_dir}
            for name, value in local_only.items():
                require(value is None, f"{root}.{name}",
                        "only applies when Ray is started locally, but cluster.address joins a running cluster",
                        f"unset {root}.{name} (the running cluster's own settings apply)")
        return self
