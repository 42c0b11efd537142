"""The shared domain model of rlsched: GPU catalogue, pools, nodes, jobs, feasibility."""

from rlsched.cluster.catalog import CATALOG, GpuModel, MigProfile, gpu_model, resolve_model_name
from rlsched.cluster.job import Job, JobKind
from rlsched.cluster.model import (
    ClusterState,
    Gpu,
    JobRun,
    MarketQuote,
    Node,
    NodeStatus,
    Placement,
    Pool,
    PoolKind,
    PoolSpec,
    RunState,
    Sharing,
    Slice,
)
from rlsched.cluster.shorthand import format_cluster, parse_cluster

__all__ = [
    "CATALOG", "ClusterState", "Gpu", "GpuModel", "Job", "JobKind", "JobRun", "MarketQuote", "MigProfile",
    "Node", "NodeStatus", "Placement", "Pool", "PoolKind", "PoolSpec", "RunState", "Sharing", "Slice",
    "format_cluster", "gpu_model", "parse_cluster", "resolve_model_name",
]
