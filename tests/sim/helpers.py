"""Small deterministic pieces shared by the simulator and policy tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.decisions import Decision, Place, Scale
from rlsched.cluster.feasibility import candidates, fits_pool_spec, scale_up_room
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, NodeStatus, PoolKind, PoolSpec, Sharing

A100 = gpu_model("A100-80GB")


def pool(name: str, *, kind: PoolKind = PoolKind.ONPREM, nodes: int = 1, gpus: int = 1, lo: int | None = None,
         sharing: Sharing = Sharing.EXCLUSIVE, replicas: int = 1, layout: tuple[str, ...] = (),
         cost: float | None = None, delay: float = 0.0, idle: float = 600.0) -> PoolSpec:
    """A pool of A100-80GB nodes; on-prem pools have ``nodes`` fixed, elastic ones ``lo..nodes``."""
    if lo is None:
        lo = nodes if kind is PoolKind.ONPREM else 0
    return PoolSpec(name=name, kind=kind, model=A100, gpus_per_node=gpus, min_nodes=lo, max_nodes=nodes,
                    sharing=sharing, replicas=replicas, mig_layout=layout, cost_per_gpu_hour=cost,
                    provision_delay_s=delay, idle_stop_s=idle)


def job(jid: str, t: float, dur: float, n: int = 1, **kw: object) -> Job:
    return Job(jid, float(t), float(dur), num_gpus=n, **kw)  # type: ignore[arg-type]


class FakeMarket:
    """A fixed-price market with scripted spot lifetimes and availability steps.

    ``lifetimes`` are handed out in order to newly ready spot nodes (then never reclaimed);
    ``avail`` is a list of ``(market_time, nodes)`` steps (None = unlimited).
    """

    def __init__(self, price: float = 0.0, lifetimes: Sequence[float] = (),
                 avail: Sequence[tuple[float, int]] | None = None) -> None:
        self.p = price
        self.lifetimes = list(lifetimes)
        self.avail = list(avail) if avail is not None else None
        self.sampled: list[float] = []

    def price(self, pool: PoolSpec, t: float) -> float:
        return self.p

    def ondemand_price(self, pool: PoolSpec, t: float) -> float:
        return self.p

    def cost(self, pool: PoolSpec, t0: float, t1: float) -> float:
        return self.p * (t1 - t0) / 3600.0

    def spot_available(self, pool: PoolSpec, t: float) -> int | None:
        if self.avail is None:
            return None
        n = None
        for ts, v in self.avail:
            if ts <= t:
                n = v
        return n

    def availability_changes(self, pool: PoolSpec, t0: float, t1: float) -> list[float]:
        if self.avail is None:
            return []
        return [ts for ts, _ in self.avail if t0 <= ts < t1]

    def sample_lifetime(self, pool: PoolSpec, rng: np.random.Generator) -> float | None:
        if not self.lifetimes:
            return None
        life = self.lifetimes.pop(0)
        self.sampled.append(life)
        return life

    def reclaim_rate_per_hour(self, pool: PoolSpec) -> float:
        return 0.0


class Greedy:
    """Place queued jobs in submission order at their first candidate; optionally buy nodes.

    ``scale``: elastic pools (in order) to grow by one node when a queued job fits nowhere
    and nothing is provisioning (at most ``max_scales`` times). ``hook(state)`` may yield extra
    decisions first.
    """

    name = "greedy"

    def __init__(self, scale: Sequence[str] = (),
                 hook: Callable[[ClusterState], Iterator[Decision]] | None = None, max_scales: int = 10**9) -> None:
        self.scale = list(scale)
        self.max_scales = max_scales
        self.scales = 0
        self.hook = hook
        self.calls: list[float] = []

    def reset(self, state: ClusterState) -> None:
        self.calls.clear()

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        self.calls.append(state.time)
        if self.hook is not None:
            yield from self.hook(state)
        blocked = []
        for run in list(state.queue.values()):
            if run.job.job_id not in state.queue:
                continue
            c = candidates(state, run.job)
            if c:
                yield Place(run.job.job_id, c[0])
            else:
                blocked.append(run)
        provisioning = any(n.status is NodeStatus.PROVISIONING for n in state.nodes.values())
        if not blocked or self.scales >= self.max_scales or provisioning:
            return
        for name in self.scale:
            p = state.pools[name]
            if not any(fits_pool_spec(r.job, p.spec) for r in blocked):
                continue
            if scale_up_room(state, p) > 0:
                self.scales += 1
                yield Scale(name, 1)
                return
