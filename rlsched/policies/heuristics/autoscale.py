"""Scaling rules for elastic pools: how much capacity to buy for a waiting queue.

The engine already stops elastic nodes that sit idle for the pool's
``idle_stop_s`` (auto start/stop), so these rules only decide scale-ups. They size
the request from the queue: GPUs that the blocked jobs need, minus what is already
being provisioned, in whole nodes, within the pool's :func:`headroom` (the
feasibility module's ``scale_up_room``: its maximum and, for spot, the market's
availability), so every scale-up they yield passes ``check_decision``.

**Buying ahead of a forecast.** A node bought when a job queues arrives one
provisioning delay later, so every job that arrives to a full cluster waits at least
that long. When a demand forecaster runs (``ClusterState.demand_forecast``, see
:mod:`rlsched.workload.forecast`), :class:`QueueAutoscaler` also buys for the jobs
expected *during* the provisioning delay ``d`` of the pool it would buy in::

    lead = D_*(now, H) * min(1, d / H)
    buy  = lead - (free GPUs now + GPUs provisioning + GPUs bought this scan - GPUs the blocked jobs need)

``D_*`` is the forecast total (average GPUs that the next ``H`` seconds of arrivals
keep busy); spreading it evenly over the horizon and assuming each arrival needs its
GPUs for at least ``d`` gives the GPUs arriving within ``d`` (a lower bound when jobs
are shorter than the horizon). A positive shortfall buys whole nodes in the cheapest
elastic pool the autoscaler may use (:meth:`QueueAutoscaler.forecast_pool`), within
``max_step``. It is a no-op without a forecast, with a zero delay, or when the
pre-bought capacity is still idle or coming (so a wrong forecast costs at most one
lead's worth of nodes until the engine's idle stop returns them). The heuristics
only scan when the queue is non-empty or a forecast is published
(:class:`~rlsched.policies.heuristics.queue.QueueHeuristic`). ``forecast_lead=False`` turns it off.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from rlsched.cluster.decisions import Decision, Scale
from rlsched.cluster.feasibility import fits_pool_spec
from rlsched.cluster.feasibility import scale_up_room as headroom
from rlsched.cluster.model import ClusterState, JobRun, Pool, PoolKind


def scale_for_demand(state: ClusterState, demand: dict[str, float], max_step: int) -> Iterator[Scale]:
    """Scale-ups that cover ``demand`` (GPUs wanted per elastic pool).

    GPUs already provisioning in a pool count against its demand; the rest is bought in
    whole nodes, within the pool's headroom and ``max_step`` nodes per pool.
    """
    for name, gpus in demand.items():
        pool = state.pools[name]
        need = gpus - pool.provisioning_gpus()
        if need <= 0:
            continue
        nodes = min(math.ceil(need / pool.spec.gpus_per_node), headroom(state, pool), max_step)
        if nodes > 0:
            yield Scale(name, nodes)


def cheapest_with_headroom(state: ClusterState, pools: list[Pool]) -> Pool | None:
    """The pool with room to grow and the lowest current price per GPU-hour (first on ties)."""
    best = None
    best_price = math.inf
    for pool in pools:
        if headroom(state, pool) <= 0:
            continue
        q = state.quotes.get(pool.name)
        price = q.price_per_gpu_hour if q else 0.0
        if price < best_price:
            best, best_price = pool, price
    return best


class QueueAutoscaler:
    """Buy nodes for blocked jobs in the cheapest elastic pool that can run each.

    ``max_step`` bounds the nodes requested per pool per decision, so one burst
    does not buy a whole pool at once.
    """

    def __init__(self, max_step: int = 8, forecast_lead: bool = True) -> None:
        self.max_step = max_step
        self.forecast_lead = forecast_lead

    def reset(self, state: ClusterState) -> None:
        return None

    def choose_pool(self, state: ClusterState, run: JobRun, pools: list[Pool]) -> Pool | None:
        """The elastic pool to buy capacity in for ``run`` (cheapest first)."""
        return cheapest_with_headroom(state, pools)

    def forecast_pool(self, state: ClusterState, pools: list[Pool]) -> Pool | None:
        """The elastic pool to buy forecast capacity in: the cheapest with headroom (override to restrict)."""
        return cheapest_with_headroom(state, pools)

    def forecast_decisions(self, state: ClusterState, elastic: list[Pool], blocked_gpus: float,
                           bought: dict[str, int]) -> Iterator[Decision]:
        """Scale-ups for the demand forecast over the provisioning delay (see the module docstring)."""
        fc = state.demand_forecast
        horizon = state.demand_forecast_horizon_s
        if not self.forecast_lead or not fc or horizon <= 0:
            return
        total = fc.get("*", 0.0)
        if total <= 0:
            return
        pool = self.forecast_pool(state, elastic)
        if pool is None:
            return
        lead = total * min(1.0, pool.spec.provision_delay_s / horizon)
        if lead <= 0:
            return
        free = max(state.capacity_gpus() - state.allocated, 0.0)
        coming = sum(p.provisioning_gpus() for p in state.pools.values() if p.spec.kind.elastic)
        new = sum(state.pools[n].spec.gpus_per_node * k for n, k in bought.items())
        need = lead - (free + coming + new - blocked_gpus)
        if need <= 0:
            return
        step = self.max_step - bought.get(pool.name, 0)
        nodes = min(math.ceil(need / pool.spec.gpus_per_node), headroom(state, pool) - bought.get(pool.name, 0), step)
        if nodes > 0:
            yield Scale(pool.name, nodes)

    def decide(self, state: ClusterState, blocked: list[JobRun]) -> Iterator[Decision]:
        elastic = [p for p in state.pools.values() if p.spec.kind.elastic and headroom(state, p) > 0]
        if not elastic:
            return
        bought: dict[str, int] = {}
        blocked_gpus = 0.0
        demand: dict[str, float] = {}
        # The pool choice depends only on the request shape unless a deadline is involved.
        memo: dict[tuple[object, ...], Pool | None] = {}
        for run in blocked:
            job = run.job
            key = run.shape
            if job.deadline is None and key in memo:
                pool = memo[key]
            else:
                fits = [p for p in elastic if fits_pool_spec(job, p.spec)]
                pool = self.choose_pool(state, run, fits) if fits else None
                if job.deadline is None:
                    memo[key] = pool
            if pool is not None:
                demand[pool.name] = demand.get(pool.name, 0.0) + job.gpu_demand
                blocked_gpus += job.gpu_demand
        for d in scale_for_demand(state, demand, self.max_step):
            bought[d.pool] = d.delta
            yield d
        yield from self.forecast_decisions(state, elastic, blocked_gpus, bought)


class SpotFirstAutoscaler(QueueAutoscaler):
    """Spot first, on-demand when spot is short or a deadline is at risk.

    A job whose slack (deadline - now - estimated run time) is below
    ``risk_factor`` x its estimated run time plus the provisioning delay is not
    trusted to spot: a reclaim could make it late.
    """

    def __init__(self, max_step: int = 8, risk_factor: float = 0.5, forecast_lead: bool = True) -> None:
        super().__init__(max_step, forecast_lead)
        self.risk_factor = risk_factor

    def at_risk(self, state: ClusterState, run: JobRun, delay: float) -> bool:
        dl = run.job.deadline
        if dl is None:
            return False
        if state.estimator.oracle:
            est = max(run.job.duration - run.work_done, 0.0)
        else:
            est = state.estimator.estimate(run.job)
        slack = dl - state.time - est
        return slack < self.risk_factor * est + delay

    def choose_pool(self, state: ClusterState, run: JobRun, pools: list[Pool]) -> Pool | None:
        spot = [p for p in pools if p.spec.kind is PoolKind.SPOT and headroom(state, p) > 0]
        other = [p for p in pools if p.spec.kind is not PoolKind.SPOT and headroom(state, p) > 0]
        if spot and run.job.preemptible and not self.at_risk(state, run, spot[0].spec.provision_delay_s):
            return super().choose_pool(state, run, spot)
        return super().choose_pool(state, run, other) if other else None
