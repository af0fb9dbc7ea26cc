"""Ray cluster layer: start/join Ray, place ranks, Worker base class and WorkerGroup.

The names are loaded on first use (PEP 562): importing the package must not start importing Ray and
torch. ``ClusterConfig``, the ``cluster:`` section's schema, lives with the other schemas in
:mod:`rlinf_cosmos3.config.cluster` and is re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlinf_cosmos3.config.cluster import ClusterConfig
from rlinf_cosmos3.lazy_exports import lazy_exports

_HOMES = {
    "Cluster": "cluster", "ClusterResources": "cluster", "NodeResources": "cluster", "current_resources": "cluster",
    "PlacementError": "placement", "PlacementPlan": "placement", "RankPlacement": "placement",
    "plan_placement": "placement",
    "Worker": "worker",
    "WorkerError": "worker_group", "WorkerGroup": "worker_group",
}
"""Public name -> the module of this package that defines it."""

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ClusterResources",
    "NodeResources",
    "PlacementError",
    "PlacementPlan",
    "RankPlacement",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "current_resources",
    "plan_placement",
]

if TYPE_CHECKING:
    from rlinf_cosmos3.cluster.cluster import Cluster, ClusterResources, NodeResources, current_resources
    from rlinf_cosmos3.cluster.placement import PlacementError, PlacementPlan, RankPlacement, plan_placement
    from rlinf_cosmos3.cluster.worker import Worker
    from rlinf_cosmos3.cluster.worker_group import WorkerError, WorkerGroup


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
