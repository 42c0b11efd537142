"""What the dashboard reads beyond the job API: the fleet, quota use, recent decisions, and cost.

:class:`FleetBoard` answers ``GET /v1/fleet``, ``/v1/quotas`` and ``/v1/decisions`` (the web dashboard at
``/ui`` polls them) from the same in-memory picture the scheduler uses: the backend's last inventory, the
mirror of jobs holding GPUs and the last live view. The scheduling lock is held only to copy references;
the answer is built outside it.

Cost follows :class:`~rlsched.market.market.TableMarket`'s pricing rule: a pool's ``cost_per_gpu_hour``
when set, else 0 for on-prem pools, else the bundled market's mean price of the pool's GPU model and
capacity (spot or on-demand; its region when priced there, else the cheapest region). The rate is what the
nodes a pool holds cost per hour (every GPU of a reachable node, busy or idle: a held node is paid for);
the total since the service started integrates that rate between reads (every dashboard poll and
Prometheus scrape is a read), so it is exact while the fleet does not change between two reads.

:class:`BoardCollector` exports the same figures to Prometheus (``rlsched_cost_rate_usd_per_hour``,
``rlsched_cost_usd_total``, ``rlsched_nodes_held``) from the service's registry.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rlsched.cluster.model import PoolKind, PoolSpec
from rlsched.runtime.backend import NodeInfo
from rlsched.runtime.store import JobRecord
from rlsched.service.quotas import holding_of, usage

#: Most decisions ``/v1/decisions`` returns.
MAX_DECISIONS = 500


def pool_price(spec: PoolSpec) -> tuple[float, str]:
    """(USD per GPU-hour, where the price comes from) of a pool (see the module doc)."""
    if spec.cost_per_gpu_hour is not None:
        return float(spec.cost_per_gpu_hour), "pool"
    if spec.kind is PoolKind.ONPREM:
        return 0.0, "on-prem"
    capacity = "spot" if spec.kind is PoolKind.SPOT else "on_demand"
    return _market_mean(spec.model.name, capacity, spec.region), "market-mean"


_MEANS: dict[tuple[str, str, str], float] = {}


def _market_mean(model: str, capacity: str, region: str) -> float:
    """The bundled market's mean price of (model, capacity, region), the cheapest region when unpriced; 0 if
    the market does not price the model at all."""
    key = (model, capacity, region)
    if key not in _MEANS:
        from rlsched.market.defaults import default_prices

        table = default_prices()
        series = table.get(model, capacity, region) if region else None
        if series is None:
            means = [s.mean() for r in table.regions(model, capacity)
                     if (s := table.get(model, capacity, r)) is not None]
            _MEANS[key] = float(min(means)) if means else 0.0
        else:
            _MEANS[key] = float(series.mean())
    return _MEANS[key]


@dataclass
class CostMeter:
    """Integrates a cost rate (USD per hour) over wall time, one sample per read (see the module doc)."""

    started: float
    total_usd: float = 0.0
    last_time: float | None = None
    last_rate: float = 0.0

    def sample(self, now: float, rate_per_hour: float) -> float:
        """Add the previous rate over the time since the previous sample; returns the total so far."""
        if self.last_time is not None and now > self.last_time:
            self.total_usd += self.last_rate * (now - self.last_time) / 3600.0
        elif self.last_time is None and now > self.started:
            self.total_usd += rate_per_hour * (now - self.started) / 3600.0
        self.last_time = max(now, self.last_time or now)
        self.last_rate = rate_per_hour
        return self.total_usd


def _memory_slices(model: str, profile: str) -> int:
    """Memory slices (of 8) a MIG instance of ``profile`` occupies on a ``model`` GPU (1 when unknown)."""
    from rlsched.cluster.catalog import CATALOG, resolve_model_name

    name = resolve_model_name(model)
    gpu = CATALOG.get(name) if name else None
    try:
        return gpu.profile(profile).memory_slices if gpu is not None else 1
    except Exception:  # a profile the catalogue does not know: drawn as one slice
        return 1


def node_status(info: NodeInfo, holds_jobs: bool) -> str:
    """``unknown`` (unreachable), ``draining`` (cordoned with jobs), ``cordoned`` (idle) or ``ready``."""
    if not info.reachable:
        return "unknown"
    if info.cordoned:
        return "draining" if holds_jobs else "cordoned"
    return "ready"


class FleetBoard:
    """The dashboard's reads of a running :class:`~rlsched.service.service.SchedulerService` (see the module doc).

    Args:
        service: the service (its inventory, mirror, policy, scheduling pass and store are read).
        clock: wall-clock source for the cost meter.
    """

    def __init__(self, service: Any, clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self.clock = clock
        self.meter = CostMeter(started=clock())
        self._meter_lock = threading.Lock()

    # ------------------------------------------------------------------ snapshot
    def _snapshot(self) -> tuple[list[NodeInfo], dict[str, JobRecord], Any, dict[str, PoolSpec], Any]:
        svc = self.service
        with svc.ctx.lock:
            nodes = list(svc.inventory.nodes)
            holding = dict(svc.mirror.holding)
            view = svc.mirror.view or svc.scheduling.current_view()
            return nodes, holding, view, dict(view.pools), svc.policy.spec

    def fleet(self) -> dict[str, Any]:
        """Every node and GPU with its MIG instances and the jobs on them, plus cost and nodes held per kind."""
        nodes, holding, view, pools, _spec = self._snapshot()
        host_pool = {n: name for name, p in view.state.pools.items() for n in p.nodes}
        on_device: dict[str, JobRecord] = {}
        for rec in holding.values():
            if rec.allocation is not None:
                for dev in rec.allocation.devices:
                    on_device[dev] = rec
        out_nodes = []
        rate = 0.0
        held: dict[str, dict[str, int]] = {}
        per_pool: dict[str, dict[str, Any]] = {}
        for info in sorted(nodes, key=lambda n: n.hostname):
            pool = host_pool.get(info.hostname)
            spec = pools.get(pool) if pool is not None else None
            wanted = view.physical.get(info.hostname)
            gpus = [self._gpu(g, on_device, view) for g in sorted(info.gpus, key=lambda g: g.index)
                    if wanted is None or g.index in wanted]
            busy = any(g["jobs"] or any(s["job"] for s in g["slices"]) for g in gpus)
            kind = spec.kind.value if spec is not None else ""
            out_nodes.append({"hostname": info.hostname, "pool": pool or "", "kind": kind,
                              "status": node_status(info, busy), "reachable": info.reachable,
                              "cordoned": info.cordoned, "gpus": gpus})
            if spec is not None and info.reachable:
                price, source = pool_price(spec)
                rate += price * len(gpus)
                k = held.setdefault(kind, {"nodes": 0, "gpus": 0})
                k["nodes"] += 1
                k["gpus"] += len(gpus)
                p = per_pool.setdefault(pool or "", {"kind": kind, "nodes": 0, "gpus": 0,
                                                     "usd_per_gpu_hour": price, "price_source": source,
                                                     "usd_per_hour": 0.0})
                p["nodes"] += 1
                p["gpus"] += len(gpus)
                p["usd_per_hour"] += price * len(gpus)
        now = self.clock()
        with self._meter_lock:
            total = self.meter.sample(now, rate)
        return {"time": now, "nodes": out_nodes, "unassigned": list(view.unassigned),
                "held": held, "audit_last_id": self.service.store.last_audit_id(),
                "cost": {"usd_per_hour": rate, "usd_total": total, "since": self.meter.started, "pools": per_pool}}

    @staticmethod
    def _gpu(g: Any, on_device: dict[str, JobRecord], view: Any) -> dict[str, Any]:
        def job(rec: JobRecord | None) -> dict[str, Any] | None:
            return None if rec is None else {"id": rec.id, "user": rec.user, "state": rec.state.value}

        slices = [{"profile": d.profile, "start": d.start, "size": _memory_slices(g.model, d.profile),
                   "uuid": d.uuid, "job": job(on_device.get(d.uuid))}
                  for d in sorted(g.mig_devices, key=lambda d: d.start)]
        whole = on_device.get(g.uuid)
        return {"index": g.index, "uuid": g.uuid, "model": g.model or g.name, "memory_mib": g.memory_mib,
                "healthy": g.healthy and g.uuid not in view.unhealthy, "problem": view.gpu_problems.get(g.uuid, ""),
                "mig": g.mig_current, "slices": slices, "jobs": [j for j in (job(whole),) if j is not None]}

    # ------------------------------------------------------------------ quotas and decisions
    def quotas(self) -> dict[str, Any]:
        """Each quota's limits and its principal's use now, and what each user holds per pool."""
        _nodes, holding, _view, pools, spec = self._snapshot()
        now = self.clock()
        holdings = [h for r in holding.values() if (h := holding_of(r, pools)) is not None]
        finished = []
        if any(q.max_gpu_hours_per_day is not None for q in spec.quotas.values()):
            from rlsched.runtime.store import JobState

            recs = self.service.store.jobs([JobState.DONE, JobState.FAILED, JobState.CANCELLED],
                                           finished_since=now - 86_400.0)
            finished = [h for r in recs if (h := holding_of(r, pools)) is not None]
        quotas = []
        for q in spec.quotas.values():
            used = usage(q, [*holdings, *finished], now)
            quotas.append({"name": q.name, "pool": q.pool, "principal": q.principal, "max_gpus": q.max_gpus,
                           "max_slices": dict(q.max_slices), "max_gpu_hours_per_day": q.max_gpu_hours_per_day,
                           "used": {"gpus": used.gpus, "slices": dict(used.slices),
                                    "gpu_hours": round(used.gpu_hours, 4)}})
        users: dict[str, dict[str, Any]] = {}
        for h in holdings:
            u = users.setdefault(h.user, {"jobs": 0, "gpus": 0, "slices": {}, "pools": []})
            u["jobs"] += 1
            u["gpus"] += h.gpus
            if h.profile is not None:
                u["slices"][h.profile] = u["slices"].get(h.profile, 0) + 1
            if h.pool not in u["pools"]:
                u["pools"].append(h.pool)
        return {"quotas": quotas, "users": dict(sorted(users.items()))}

    def decisions(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` decisions the scheduler recorded (applied or refused), oldest first."""
        return list(self.service.store.recent_decisions(min(limit, MAX_DECISIONS)))


class BoardCollector(Collector):
    """Prometheus families for cost and nodes held, read from a :class:`FleetBoard` at scrape time."""

    def __init__(self, board: FleetBoard) -> None:
        self.board = board

    def describe(self) -> Iterator[Any]:
        yield from self._families(None)

    def collect(self) -> Iterator[Any]:
        try:
            fleet = self.board.fleet()
        except Exception:  # a scrape must not fail because the service is starting or reloading
            return
        yield from self._families(fleet)

    @staticmethod
    def _families(fleet: dict[str, Any] | None) -> Iterator[Any]:
        rate = GaugeMetricFamily("rlsched_cost_rate_usd_per_hour", "What the nodes each pool holds cost per hour "
                                 "(pool price, else the bundled market's mean; on-prem 0)", labels=["pool", "kind"])
        total = CounterMetricFamily("rlsched_cost_usd", "Cost of the nodes held since the service started "
                                    "(integrated between reads)")
        held = GaugeMetricFamily("rlsched_nodes_held", "Reachable nodes held per pool and capacity kind",
                                 labels=["pool", "kind"])
        if fleet is not None:
            for pool, p in sorted(fleet["cost"]["pools"].items()):
                rate.add_metric([pool, p["kind"]], p["usd_per_hour"])
                held.add_metric([pool, p["kind"]], p["nodes"])
            total.add_metric([], fleet["cost"]["usd_total"])
        yield rate
        yield total
        yield held


_BOARDS: weakref.WeakKeyDictionary[Any, FleetBoard] = weakref.WeakKeyDictionary()
_BOARDS_LOCK = threading.Lock()


def board_for(service: Any) -> FleetBoard | None:
    """The one :class:`FleetBoard` of ``service`` (its collector registered once on the service's registry), or
    None when ``service`` is not a scheduler service with an inventory and a job mirror."""
    if not all(hasattr(service, a) for a in ("ctx", "inventory", "mirror", "scheduling", "policy", "store")):
        return None
    with _BOARDS_LOCK:
        board = _BOARDS.get(service)
        if board is None:
            board = _BOARDS[service] = FleetBoard(service, clock=getattr(service, "clock", time.time))
            registry = getattr(service, "registry", None)
            if registry is not None:
                registry.register(BoardCollector(board))
        return board
