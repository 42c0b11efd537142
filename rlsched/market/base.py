"""What the simulator asks of a market: prices, costs, spot availability, reclaims.

The engine only talks to :class:`Market`; readers of the real GCP/AWS/Azure data,
the canonical CSVs and the preemption models build one.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from rlsched.cluster.model import PoolSpec


class Market(Protocol):
    """Prices and spot behaviour over simulated time (seconds from the run start)."""

    def price(self, pool: PoolSpec, t: float) -> float:
        """USD per GPU-hour of ``pool``'s capacity at time ``t`` (0 for free on-prem)."""
        ...

    def ondemand_price(self, pool: PoolSpec, t: float) -> float:
        """USD per GPU-hour of the on-demand equivalent of ``pool`` at ``t`` (for slack/cost signals)."""
        ...

    def cost(self, pool: PoolSpec, t0: float, t1: float) -> float:
        """USD for holding ONE GPU of ``pool`` from ``t0`` to ``t1`` (integral of price)."""
        ...

    def spot_available(self, pool: PoolSpec, t: float) -> int | None:
        """Spot nodes obtainable at ``t`` (None = unlimited) for a spot pool."""
        ...

    def availability_changes(self, pool: PoolSpec, t0: float, t1: float) -> list[float]:
        """Times in ``[t0, t1)`` when spot availability of ``pool`` changes."""
        ...

    def sample_lifetime(self, pool: PoolSpec, rng: np.random.Generator) -> float | None:
        """Seconds until the market reclaims a newly started spot node (None = never)."""
        ...

    def reclaim_rate_per_hour(self, pool: PoolSpec) -> float:
        """Mean reclaim hazard of one spot node, per hour (0 for non-spot pools)."""
        ...
