"""Decide which node (and GPU/CPU slot) each rank gets, and reserve it with a Ray placement group.

Layout: ranks are split into ``num_nodes`` contiguous blocks, one per node, so ``node_rank =
rank // ranks_per_node`` and ``local_rank = rank % ranks_per_node`` (torchrun's convention).
Each node's block is one placement-group bundle holding all its ranks' resources; bundles are
``STRICT_SPREAD`` over distinct nodes (``STRICT_PACK`` for one node), and each rank's actor is
pinned to its node's bundle. Ray then hands each GPU rank its own GPU (``CUDA_VISIBLE_DEVICES``).

:func:`plan_placement` is pure and checks the request against the cluster's totals first, so a
GPU config on a CPU-only cluster fails before any actor starts, with the field to change.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from rlinf_cosmos3.cluster.cluster import ClusterResources
from rlinf_cosmos3.config.base import ConfigError


class PlacementError(ConfigError):
    """The requested ranks do not fit the cluster; the message says what to change."""


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    node_rank: int
    local_rank: int


@dataclass(frozen=True)
class PlacementPlan:
    ranks: tuple[RankPlacement, ...]
    num_nodes: int
    ranks_per_node: int
    # Resources of one rank's actor (Ray's num_cpus / num_gpus / custom resources).
    cpus_per_rank: float
    gpus_per_rank: int
    custom_per_rank: dict[str, float]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def strategy(self) -> str:
        return "STRICT_PACK" if self.num_nodes == 1 else "STRICT_SPREAD"

    def node_bundle(self) -> dict[str, float]:
        """Resources of one node's bundle: all of its ranks together."""
        k = self.ranks_per_node
        bundle = {"CPU": self.cpus_per_rank * k}
        if self.gpus_per_rank:
            bundle["GPU"] = float(self.gpus_per_rank * k)
        bundle.update({name: amount * k for name, amount in self.custom_per_rank.items()})
        return bundle


def plan_placement(
    resources: ClusterResources,
    num_ranks: int,
    *,
    num_nodes: int = 1,
    gpus_per_rank: int = 0,
    cpus_per_rank: float = 1.0,
    custom_per_rank: dict[str, float] | None = None,
    gpu_field: str = "cluster.num_gpus_per_node",
) -> PlacementPlan:
    """Lay out ``num_ranks`` ranks over ``num_nodes`` nodes, or raise :class:`PlacementError`."""
    if num_ranks < 1:
        raise PlacementError("num_ranks", f"must be >= 1, got {num_ranks}")
    if num_nodes < 1 or num_ranks % num_nodes:
        raise PlacementError("cluster.num_nodes", f"{num_ranks} ranks cannot be split evenly over {num_nodes} node(s)",
                             "use a number of ranks divisible by the number of nodes")
    if gpus_per_rank < 0 or cpus_per_rank <= 0:
        raise PlacementError("cluster.cpus_per_rank", f"need gpus_per_rank >= 0 and cpus_per_rank > 0, "
                             f"got {gpus_per_rank} and {cpus_per_rank}")
    wanted_gpus = num_ranks * gpus_per_rank
    if wanted_gpus > resources.total_gpus:
        fix = (f"set {gpu_field}=0 / use a CPU config" if resources.total_gpus == 0
               else f"lower {gpu_field} to fit {resources.total_gpus:g} GPUs, or add GPU nodes")
        raise PlacementError(gpu_field, f"requested {wanted_gpus} GPUs, cluster has {resources.total_gpus:g}", fix)
    if num_nodes > resources.num_nodes:
        raise PlacementError("cluster.num_nodes", f"requested {num_nodes} nodes, cluster has {resources.num_nodes}",
                             f"set cluster.num_nodes<={resources.num_nodes} or add nodes to the Ray cluster")

    k = num_ranks // num_nodes
    plan = PlacementPlan(
        ranks=tuple(RankPlacement(rank=r, node_rank=r // k, local_rank=r % k) for r in range(num_ranks)),
        num_nodes=num_nodes, ranks_per_node=k, cpus_per_rank=float(cpus_per_rank),
        gpus_per_rank=gpus_per_rank, custom_per_rank=dict(custom_per_rank or {}),
    )
    bundle = plan.node_bundle()
    fitting = [n for n in resources.nodes if _fits(bundle, n.cpus, n.gpus, n.custom)]
    if len(fitting) < num_nodes:
        raise PlacementError(
            gpu_field if gpus_per_rank else "cluster.num_cpu_ranks_per_node",
            f"{num_nodes} node(s) must each hold {k} rank(s) = {_fmt(bundle)}, but only {len(fitting)} "
            f"node(s) can; cluster: {resources}",
            "use fewer ranks per node, a smaller cluster.cpus_per_rank, or more/larger nodes")
    return plan


def _fits(bundle: dict[str, float], cpus: float, gpus: float, custom: dict[str, float]) -> bool:
    have = {"CPU": cpus, "GPU": gpus, **custom}
    return all(have.get(name, 0.0) >= amount for name, amount in bundle.items())


def _fmt(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"


def reserve(plan: PlacementPlan, timeout_s: float, name: str = "") -> PlacementGroup:
    """Create the placement group and wait until Ray has reserved every bundle."""
    pg = placement_group([plan.node_bundle() for _ in range(plan.num_nodes)], strategy=plan.strategy, name=name)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except GetTimeoutError:
        remove_placement_group(pg)
        raise PlacementError(
            "cluster.placement_timeout_s",
            f"Ray could not reserve {plan.num_nodes} x {_fmt(plan.node_bundle())} ({plan.strategy}) within "
            f"{timeout_s:g} s; available now: {ray.available_resources()}",
            "other groups may hold the resources: shut them down, or request fewer ranks") from None
    return pg


def bundle_node_ids(pg: PlacementGroup) -> list[str]:
    """Node id hosting each bundle, in bundle (= node rank) order."""
    table = ray.util.placement_group_table(pg)
    mapping = table["bundles_to_node_id"]
    return [mapping[i] for i in range(len(mapping))]
