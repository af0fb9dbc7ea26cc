"""Ray cluster layer: start/join Ray, place ranks, Worker base class and WorkerGroup."""

from rlinf_cosmos3.cluster.cluster import Cluster, ClusterResources, NodeResources, current_resources
from rlinf_cosmos3.cluster.config import ClusterConfig
from rlinf_cosmos3.cluster.placement import PlacementError, PlacementPlan, RankPlacement, plan_placement
from rlinf_cosmos3.cluster.worker import Worker
from rlinf_cosmos3.cluster.worker_group import WorkerError, WorkerGroup

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
