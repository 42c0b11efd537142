"""Forecast-aware autoscaling: a forecast burst is provisioned for before it arrives."""

from __future__ import annotations

from collections.abc import Sequence

from sim.helpers import job, pool

from rlsched.cluster.decisions import Scale
from rlsched.cluster.job import Job
from rlsched.cluster.model import PoolKind
from rlsched.policies import make_policy
from rlsched.policies.heuristics.autoscale import QueueAutoscaler
from rlsched.sim.engine import Engine, SimConfig
from rlsched.workload.forecast import FORECAST_KEYS

BURST_T = 10_000.0
DELAY = 600.0
H = 600.0


class BurstForecast:
    """Knows that 32 GPUs of work arrive at ``BURST_T`` (a perfect forecast of the burst only)."""

    def fit(self, jobs: Sequence[Job]) -> None:
        return None

    def observe(self, job: Job) -> None:
        return None

    def predict(self, now: float, horizon_s: float) -> dict[str, float]:
        out = dict.fromkeys(FORECAST_KEYS, 0.0)
        if now <= BURST_T < now + horizon_s:
            out["1"] = out["*"] = 32.0
        return out


def _workload() -> list[Job]:
    # Quiet small jobs every 100 s (they keep decision points coming), then a burst of 32 1-GPU jobs.
    quiet = [job(f"q{i}", 100.0 * i, 50.0) for i in range(int(BURST_T // 100))]
    burst = [job(f"b{i}", BURST_T, 3600.0) for i in range(32)]
    return quiet + burst


def _first_scale(forecaster: object | None) -> tuple[float | None, float]:
    pools = [pool("onprem", nodes=1, gpus=8),
             pool("od", kind=PoolKind.ONDEMAND, nodes=4, gpus=8, cost=1.0, delay=DELAY, idle=3600.0)]
    sched = make_policy("fifo")
    scale_times: list[float] = []
    inner = sched.decide

    def decide(state):  # type: ignore[no-untyped-def]
        for d in inner(state):
            if isinstance(d, Scale) and d.delta > 0:
                scale_times.append(state.time)
            yield d

    sched.decide = decide  # type: ignore[method-assign]
    eng = Engine(pools, _workload(), None, SimConfig(), forecaster=forecaster,  # type: ignore[arg-type]
                 forecast_horizon_s=H)
    rep = eng.run(sched)
    burst_wait = max(r.first_start - r.job.submit_time for r in eng.runs.values() if r.job.job_id.startswith("b"))
    del rep
    return (scale_times[0] if scale_times else None), burst_wait


def test_forecast_of_a_burst_scales_up_before_it_arrives() -> None:
    t_fc, wait_fc = _first_scale(BurstForecast())
    t_none, wait_none = _first_scale(None)
    assert t_fc is not None and BURST_T - H <= t_fc < BURST_T  # bought ahead, within the forecast window
    assert t_none is not None and t_none >= BURST_T  # queue-driven only: buys when the burst queues
    assert wait_fc < wait_none  # and the burst waits less for its GPUs
    assert wait_none >= DELAY


def test_no_forecast_or_lead_disabled_is_the_queue_rule() -> None:
    auto = QueueAutoscaler(forecast_lead=False)
    assert auto.forecast_lead is False
    # Without a forecast published, forecast_decisions yields nothing whatever the pools.
    from rlsched.cluster.model import ClusterState

    state = ClusterState([pool("od", kind=PoolKind.ONDEMAND, nodes=4, gpus=8, delay=DELAY)])
    assert list(QueueAutoscaler().forecast_decisions(state, list(state.pools.values()), 0.0, {})) == []
    state.demand_forecast, state.demand_forecast_horizon_s = {"*": 32.0}, H
    assert [d for d in auto.forecast_decisions(state, list(state.pools.values()), 0.0, {})] == []
    got = list(QueueAutoscaler().forecast_decisions(state, list(state.pools.values()), 0.0, {}))
    assert got == [Scale("od", 4)]  # 32 GPUs expected within the delay, none free: 4 nodes of 8
