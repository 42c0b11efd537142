"""Turn a loaded :class:`Spec` into the simulator's :class:`PoolSpec` list.

``rlsched simulate --pools pool.hcl`` runs the declared pools: a pool of listed
hostnames has that many nodes; a counted pool has ``node_count``. On-prem pools
are fixed (min = max); elastic pools scale between ``min_nodes`` (default 0) and
``max_nodes`` (default the node count) and start at ``min_nodes``, as the
simulator's elastic pools do. A pool's ``gang`` attribute becomes its
:class:`GangMode`, so simulated and live pools place multi-node jobs by the same rule.
"""

from __future__ import annotations

from rlsched.cluster.catalog import CATALOG
from rlsched.cluster.model import GangMode, PoolKind, PoolSpec, Sharing
from rlsched.spec.model import PoolDecl, Spec

DEFAULT_GPUS_PER_NODE = 8
_KIND = {"on_prem": PoolKind.ONPREM, "on_demand": PoolKind.ONDEMAND, "spot": PoolKind.SPOT}


def pool_spec(spec: Spec, pool: PoolDecl) -> PoolSpec:
    """The simulator's view of one declared pool."""
    kind = _KIND[pool.capacity]
    count = pool.node_count if pool.node_count is not None else len(pool.nodes)
    per_node = pool.gpus_per_node or (len(pool.gpus) if pool.gpus != "all" else DEFAULT_GPUS_PER_NODE)
    if kind is PoolKind.ONPREM:
        lo = hi = count
    else:
        hi = pool.max_nodes if pool.max_nodes is not None else count
        lo = pool.min_nodes if pool.min_nodes is not None else 0
    layout: tuple[str, ...] = ()
    sharing = Sharing.EXCLUSIVE
    if pool.mig_layout is not None:
        sharing = Sharing.MIG
        devices = spec.layouts[pool.mig_layout].devices
        layout = tuple(p for p, n in devices.items() for _ in range(n))
    elif pool.timeslice_replicas is not None and pool.timeslice_replicas > 1:
        sharing = Sharing.TIMESLICE
    return PoolSpec(
        name=pool.name,
        kind=kind,
        model=CATALOG[pool.gpu_model],
        gpus_per_node=per_node,
        min_nodes=lo,
        max_nodes=hi,
        sharing=sharing,
        replicas=pool.timeslice_replicas or 1,
        mig_layout=layout,
        cost_per_gpu_hour=pool.cost_per_gpu_hour,
        region=pool.region,
        gang=GangMode(pool.gang),
    )


def to_pool_specs(spec: Spec) -> list[PoolSpec]:
    """Every declared pool as a :class:`PoolSpec`, in declaration order."""
    return [pool_spec(spec, p) for p in spec.pools.values()]
