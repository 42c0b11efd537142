"""Prometheus metrics of the scheduler service, in a registry of its own.

The HTTP layer serves ``prometheus_client.generate_latest(service.registry)``.
Every family is prefixed ``rlsched_``. Counters the fallback guard keeps as plain
integers (decisions per source, fallbacks per reason, refused actions, audit sink
errors) are mirrored here by :meth:`ServiceMetrics.sync_guard`, which adds only
what changed since the last call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Decision latency buckets (seconds): fine from 100 µs, up to a slow policy.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0)

#: Queue wait buckets (seconds): from a job that starts at once to one that waits a day.
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)


class ServiceMetrics:
    """The service's metric families (see the module doc)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_length = Gauge("rlsched_queue_length", "Jobs waiting in the queue", registry=r)
        self.running_jobs = Gauge("rlsched_running_jobs", "Jobs holding GPUs (running or stopping)", registry=r)
        self.jobs = Gauge("rlsched_jobs", "Jobs in the store per state", ["state"], registry=r)
        self.decisions = Counter("rlsched_decisions", "Scheduler decisions by source", ["policy"], registry=r)
        self.fallbacks = Counter("rlsched_fallbacks", "Decision points served by the fallback heuristic, by reason",
                                 ["reason"], registry=r)
        self.refused = Counter("rlsched_refused_actions", "Illegal decisions refused (never applied)", ["source"],
                               registry=r)
        self.latency = Histogram("rlsched_decision_latency_seconds", "Time the scheduler took per decision",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.allocated_gpus = Gauge("rlsched_allocated_gpus", "Whole GPUs allocated to jobs per pool", ["pool"],
                                    registry=r)
        self.allocated_slices = Gauge("rlsched_allocated_mig_slices", "MIG instances allocated per pool and profile",
                                      ["pool", "profile"], registry=r)
        self.pool_gpus = Gauge("rlsched_pool_gpus", "GPUs the service sees per pool", ["pool"], registry=r)
        self.unhealthy_gpus = Gauge("rlsched_unhealthy_gpus", "GPUs that get no new work (unhealthy)", registry=r)
        self.breaker_open = Gauge("rlsched_breaker_open", "1 while the guard's circuit breaker is open", registry=r)
        self.gpu_memory_used = Gauge("rlsched_gpu_memory_used_mib", "GPU memory in use (MiB)", ["gpu"], registry=r)
        self.gpu_utilization = Gauge("rlsched_gpu_utilization_percent", "GPU utilisation (%)", ["gpu"], registry=r)
        self.gpu_temperature = Gauge("rlsched_gpu_temperature_celsius", "GPU temperature", ["gpu"], registry=r)
        self.gpu_power = Gauge("rlsched_gpu_power_watts", "GPU power draw", ["gpu"], registry=r)
        self.job_wait = Histogram("rlsched_job_wait_seconds", "Queue wait of each job, submission to first start",
                                  buckets=WAIT_BUCKETS, registry=r)
        self.submissions = Counter("rlsched_submissions", "Job submissions by outcome", ["outcome"], registry=r)
        self.loop_errors = Counter("rlsched_loop_errors", "Errors caught in the control loop, by stage", ["stage"],
                                   registry=r)
        self.audit_errors = Counter("rlsched_audit_write_errors", "Audit records that could not be written",
                                    registry=r)
        self.ticks = Counter("rlsched_loop_iterations", "Control-loop iterations", registry=r)
        self.last_tick = Gauge("rlsched_last_tick_timestamp_seconds", "Wall time of the last loop iteration",
                               registry=r)
        # Pre-create the label sets people alert on, so they read 0 rather than being absent.
        for p in ("primary", "fallback", "shadow"):
            self.decisions.labels(policy=p)
        self.refused.labels(source="primary")
        self._seen: dict[str, float] = {}

    # ------------------------------------------------------------------ guard mirror
    def _delta(self, key: str, value: float) -> float:
        last = self._seen.get(key, 0.0)
        self._seen[key] = value
        return value - last if value >= last else value

    def sync_guard(self, guard: Any) -> None:
        """Mirror a :class:`~rlsched.runtime.fallback.FallbackScheduler`'s counters (only the change)."""
        for label, attr in (("primary", "primary_decisions"), ("fallback", "fallback_decisions"),
                            ("shadow", "shadow_decisions")):
            d = self._delta(f"dec:{label}", float(getattr(guard, attr, 0)))
            if d > 0:
                self.decisions.labels(policy=label).inc(d)
        for reason, n in dict(getattr(guard, "fallbacks_by_reason", {})).items():
            d = self._delta(f"fb:{reason}", float(n))
            if d > 0:
                self.fallbacks.labels(reason=reason).inc(d)
        d = self._delta("refused", float(getattr(guard, "refused", 0)))
        if d > 0:
            self.refused.labels(source="primary").inc(d)
        d = self._delta("audit", float(getattr(guard, "audit_errors", 0)))
        if d > 0:
            self.audit_errors.inc(d)
        state = getattr(getattr(guard, "breaker_state", None), "value", "closed")
        self.breaker_open.set(1.0 if state == "open" else 0.0)

    def reset_guard_mirror(self) -> None:
        """Forget the mirrored values (a new guard object replaced the old one on reload)."""
        self._seen.clear()

    # ------------------------------------------------------------------ gauges
    def set_allocation(self, pools: Mapping[str, tuple[int, int, Mapping[str, int]]]) -> None:
        """Per pool: (GPUs seen, whole GPUs allocated, {profile: instances allocated})."""
        self.pool_gpus.clear()
        self.allocated_gpus.clear()
        self.allocated_slices.clear()
        for pool, (total, used, slices) in pools.items():
            self.pool_gpus.labels(pool=pool).set(total)
            self.allocated_gpus.labels(pool=pool).set(used)
            for profile, n in slices.items():
                self.allocated_slices.labels(pool=pool, profile=profile).set(n)

    def set_jobs(self, counts: Mapping[str, int]) -> None:
        for state, n in counts.items():
            self.jobs.labels(state=state).set(n)
        self.queue_length.set(counts.get("queued", 0))
        self.running_jobs.set(counts.get("running", 0) + counts.get("preempted", 0))

    def set_telemetry(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Per-GPU telemetry dicts (``uuid``, ``memory_used_mib``, ``utilization_gpu``, ``temperature_c``,
        ``power_w``); missing or None values are left out, stale GPUs dropped."""
        fams = ((self.gpu_memory_used, "memory_used_mib"), (self.gpu_utilization, "utilization_gpu"),
                (self.gpu_temperature, "temperature_c"), (self.gpu_power, "power_w"))
        for g, _ in fams:
            g.clear()
        for row in rows:
            uuid = str(row.get("uuid") or "")
            if not uuid:
                continue
            for g, key in fams:
                v = row.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    g.labels(gpu=uuid).set(float(v))
