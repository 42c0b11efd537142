"""How long an elastic pool's new node takes to become ready, when the pool does not say.

A pool's ``provision_delay_s`` is the time from a scale-up to a ready node. The compact
``--cluster`` shorthand and the market defaults fill it from :func:`provision_delay_s`
when it is not written out.
"""

from __future__ import annotations

from rlsched.cluster.catalog import GpuModel, gpu_model
from rlsched.cluster.model import PoolKind

__all__ = ["LARGE_GPU_EXTRA_S", "LARGE_GPU_MEMORY_GB", "PROVISION_DELAY_S", "provision_delay_s"]

#: Seconds from a scale-up request to a ready node, by capacity kind. These are
#: assumptions, not measurements: typical cloud GPU VM boot plus driver/container
#: start is 2-4 minutes; spot requests add a fulfilment step. On-prem nodes are
#: already there.
PROVISION_DELAY_S: dict[PoolKind, float] = {
    PoolKind.ONPREM: 0.0,
    PoolKind.ONDEMAND: 180.0,
    PoolKind.SPOT: 240.0,
}
#: Extra seconds for large GPUs (>= 80 GB: 8-GPU HGX hosts, bigger images, fabric
#: manager and NVLink checks, scarcer capacity).
LARGE_GPU_EXTRA_S = 120.0
LARGE_GPU_MEMORY_GB = 80


def provision_delay_s(kind: PoolKind | str, model: GpuModel | str) -> float:
    """Default provisioning delay of a node (a pool's explicit value wins).

    Args:
        kind: pool kind (or its value, e.g. ``"spot"``).
        model: GPU model or any spelling of its name.
    """
    k = kind if isinstance(kind, PoolKind) else PoolKind(str(kind).lower())
    m = model if isinstance(model, GpuModel) else gpu_model(model)
    base = PROVISION_DELAY_S[k]
    if k is not PoolKind.ONPREM and m.memory_gb >= LARGE_GPU_MEMORY_GB:
        base += LARGE_GPU_EXTRA_S
    return base
