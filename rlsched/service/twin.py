"""The service's digital twin: replay its own recent history on the simulator, under every policy.

Every ``twin.every`` (a ``policy`` block's ``twin {}``; see :class:`~rlsched.spec.model.TwinDecl`) and on
``rlsched advise``, the twin reads the jobs the service ran in the last ``twin.days`` days
(:mod:`rlsched.workload.history`, a read-only snapshot of the store) and replays exactly those jobs, at
their real submission times and with the run time they really took, on the declared pools (sized by the
live inventory when there is one) under the served policy, every heuristic and the block's candidate
models. It reports, per policy, the counterfactual mean JCT, mean wait, cost and deadline misses, and what
really happened to the same jobs - so the served policy's row against the real row is the simulator's
error on this cluster.

The replay runs in a thread of its own and never takes the scheduling lock: it reads the store through
its own read-only connection and simulates on copies. What it does with a result is the block's
``adapt``:

* ``off``: publish the Prometheus gauges (``rlsched_twin_mean_jct_seconds{policy=...}`` and friends);
* ``recommend``: also audit (``twin-advice``) a policy that beat the served one by ``twin.margin`` on
  two consecutive replays;
* ``switch``: serve that policy (an audited ``policy-switch`` with the reason), with the same hysteresis;
  a learned candidate is only ever switched to when its promotion gate (``family_gate``) passed, and a
  heuristic only when it finished every job the served policy finished with no more deadline misses.

A switch lasts until the next reload (``rlsched reload`` or a restart serves the spec's block again).
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlsched.errors import RlschedError
from rlsched.workload.history import HistoryExport, read_history

if TYPE_CHECKING:
    from rlsched.cluster.model import PoolSpec
    from rlsched.cluster.scheduler import Scheduler
    from rlsched.runtime.backend import NodeInfo
    from rlsched.service.service import SchedulerService
    from rlsched.spec.model import PolicyDecl, Spec

LOG = logging.getLogger("rlsched.twin")

#: Replays in a row a policy must win (by the margin) before it is recommended or served.
CONSECUTIVE_WINS = 2


class TwinError(RlschedError):
    """The twin cannot replay (no history in the window, no pools...)."""


@dataclass(frozen=True)
class PolicyOutcome:
    """One policy's counterfactual (or the real outcome) on the replayed jobs.

    ``cost_usd`` is None for the real row (the store records no prices).
    """

    policy: str
    mean_jct_s: float
    mean_wait_s: float
    cost_usd: float | None
    deadline_misses: int
    jobs_completed: int
    jobs_unfinished: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "mean_jct_s": self.mean_jct_s, "mean_wait_s": self.mean_wait_s,
                "cost_usd": self.cost_usd, "deadline_misses": self.deadline_misses,
                "jobs_completed": self.jobs_completed, "jobs_unfinished": self.jobs_unfinished}


@dataclass
class TwinResult:
    """A replay of the history under every policy.

    Attributes:
        served: the served policy's label (its row in ``rows``).
        rows: label -> counterfactual outcome (the served policy included).
        actual: what really happened to the same jobs.
        jobs: jobs replayed.
        days: the history window.
        finished_at: when the replay finished (Unix seconds).
        wall_s: how long it took.
        failed: label -> why that policy could not be replayed.
        refs: label -> what serving it means (a heuristic name, or a model reference).
    """

    served: str
    rows: dict[str, PolicyOutcome]
    actual: PolicyOutcome
    jobs: int
    days: float
    finished_at: float
    wall_s: float
    failed: dict[str, str] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def vs_served(self, label: str) -> float:
        """``label``'s mean JCT over the served policy's (1.0: the same; nan without a served row)."""
        served = self.rows.get(self.served)
        if served is None or served.mean_jct_s <= 0:
            return math.nan
        return self.rows[label].mean_jct_s / served.mean_jct_s

    def simulator_error(self) -> float:
        """The served policy's counterfactual mean JCT over the real one, minus 1 (0.05: 5 % too slow)."""
        served = self.rows.get(self.served)
        if served is None or self.actual.mean_jct_s <= 0:
            return math.nan
        return served.mean_jct_s / self.actual.mean_jct_s - 1.0

    def best(self) -> str:
        """The policy with the lowest counterfactual mean JCT among those that finished every job the served
        policy finished with no more deadline misses (the served one when none does better)."""
        served = self.rows.get(self.served)
        if served is None:
            return self.served
        fair = [r for r in self.rows.values()
                if r.jobs_completed >= served.jobs_completed and r.deadline_misses <= served.deadline_misses]
        return min(fair, key=lambda r: (r.mean_jct_s, r.policy != self.served, r.policy)).policy

    def to_json(self) -> dict[str, Any]:
        return {"served": self.served, "jobs": self.jobs, "days": self.days, "finished_at": self.finished_at,
                "wall_s": self.wall_s, "best": self.best(), "simulator_error": self.simulator_error(),
                "actual": self.actual.to_json(), "policies": [r.to_json() for r in self.rows.values()],
                "failed": self.failed}


# ---------------------------------------------------------------------- the replay
def served_label(decl: PolicyDecl) -> str:
    """The served block's label in the twin's table (``fifo``, ``rl:models/default``)."""
    return f"rl:{decl.model}" if decl.scheduler == "rl" else decl.scheduler


def resolve_model(model: str, spec_paths: Sequence[Path]) -> str:
    """A block's model reference as the service resolves it: URIs and absolute paths as they are, a relative
    path beside the spec files."""
    if model.startswith("models:/") or Path(model).is_absolute():
        return model
    for base in spec_paths:
        root = base if base.is_dir() else base.parent
        if (root / model).exists():
            return str(root / model)
    return model


def _model_scheduler(ref: str, label: str) -> Scheduler:
    """A learned policy as the service serves it: without node consolidation, layouts left to the spec."""
    from rlsched.learned.ppo import make_ppo_policy  # torch only when a model is replayed
    from rlsched.train.registry import download_model

    sched = make_ppo_policy(ref, name=label, fetch=download_model)
    sched.rules = [r for r in sched.rules if not r.releases_nodes]
    if sched.complement is not None:
        sched.complement.heuristic.mig_reconfigure = False
    return sched


def candidates(decl: PolicyDecl, spec_paths: Sequence[Path]) -> dict[str, str]:
    """label -> reference of every policy the twin replays: the served one, each heuristic, each candidate."""
    from rlsched.policies import available

    out = {served_label(decl): (resolve_model(decl.model or "", spec_paths) if decl.scheduler == "rl"
                                else decl.scheduler)}
    for name in available():
        out.setdefault(name, name)
    for model in decl.twin.candidates if decl.twin is not None else ():
        out.setdefault(f"rl:{model}", resolve_model(model, spec_paths))
    return out


def _build(label: str, ref: str, decl: PolicyDecl) -> Scheduler:
    from rlsched.service.served_policy import heuristic

    if label.startswith("rl:"):
        return _model_scheduler(ref, label)
    return heuristic(ref, decl.weights if ref == decl.scheduler else {})


def actual_outcome(history: HistoryExport) -> PolicyOutcome:
    """What really happened to the finished jobs of the history."""
    done = [h for h in history.jobs if not h.censored]
    jcts = [h.jct_s or 0.0 for h in done]
    waits = [h.wait_s for h in done]
    return PolicyOutcome("actual", sum(jcts) / len(jcts) if jcts else 0.0,
                         sum(waits) / len(waits) if waits else 0.0, None,
                         sum(1 for h in done if h.missed_deadline()), len(done))


def replay(history: HistoryExport, pools: Sequence[PoolSpec], decl: PolicyDecl, *,
           spec_paths: Sequence[Path] = (), only: Sequence[str] | None = None) -> TwinResult:
    """Replay the finished jobs of ``history`` on ``pools`` under every policy (see the module doc).

    ``only``: replay only these labels (the served one is always replayed).

    Raises:
        TwinError: nothing to replay.
    """
    from rlsched.scenario import build_market
    from rlsched.sim import Engine
    from rlsched.sim.engine import SimConfig

    jobs = history.to_jobs(include_running=False)
    if not jobs:
        raise TwinError("no finished job in the history window: nothing to replay")
    if not pools:
        raise TwinError("no pools to replay the history on")
    t0 = time.monotonic()
    span = max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)
    config = SimConfig(horizon_s=max(10.0 * span, span + 30 * 86400.0))
    market = build_market("default", list(pools))
    refs = candidates(decl, spec_paths)
    served = served_label(decl)
    if only is not None:
        refs = {k: v for k, v in refs.items() if k in only or k == served}
    rows: dict[str, PolicyOutcome] = {}
    failed: dict[str, str] = {}
    for label, ref in refs.items():
        try:
            sched = _build(label, ref, decl)
            rep = Engine(list(pools), jobs, market, config).run(sched)
        except Exception as exc:  # one policy that cannot run must not hide the others
            failed[label] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            LOG.warning("twin: %s could not be replayed: %s", label, failed[label])
            continue
        rows[label] = PolicyOutcome(label, rep.mean_jct_s, rep.mean_wait_s, rep.cost_usd, rep.deadline_misses,
                                    rep.jobs_completed, rep.jobs_unfinished)
    return TwinResult(served, rows, actual_outcome(history), len(jobs), 0.0, time.time(),
                      time.monotonic() - t0, failed, refs)


def live_pools(spec: Spec, nodes: Sequence[NodeInfo], now: float) -> list[PoolSpec]:
    """The declared pools as the live service sees them (nodes and GPUs per node from the inventory);
    the spec's own sizes when there is no inventory."""
    from rlsched.spec.pools import to_pool_specs

    if not nodes:
        return to_pool_specs(spec)
    from rlsched.service.view import build_view

    return list(build_view(spec, nodes, [], [], now).pools.values())


def run_twin(history: HistoryExport, spec: Spec, decl: PolicyDecl, *, days: float,
             nodes: Sequence[NodeInfo] = (), spec_paths: Sequence[Path] = ()) -> TwinResult:
    """:func:`replay` a history read for the last ``days`` (:func:`read_history`) on the spec's pools."""
    result = replay(history, live_pools(spec, nodes, history.now), decl, spec_paths=spec_paths)
    result.days = days
    return result


# ---------------------------------------------------------------------- the gate
def gate_refusal(label: str, ref: str) -> str | None:
    """Why the promotion gate would refuse serving ``label`` (None: it would not).

    Heuristics need no gate. A learned policy needs its workload-family gate passed: the ``family_gate``
    tag of a registered version, else its card's family results.
    """
    if not label.startswith("rl:"):
        return None
    from rlsched.train.registry import FAMILY_TAG, download_model, family_gate_checks

    try:
        if ref.startswith("models:/"):
            from rlsched.train.registry import resolve_version

            mv = resolve_version(ref)
            fam: Mapping[str, Any] | None = None
            raw = dict(mv.tags or {}).get(FAMILY_TAG)
            if raw:
                fam = json.loads(raw)
            if fam is None:
                with tempfile.TemporaryDirectory(prefix="rlsched-twin-") as tmp:
                    fam = _folder_families(download_model(f"models:/{mv.name}/{mv.version}", tmp))
        else:
            fam = _folder_families(Path(ref))
    except (RlschedError, OSError, ValueError) as exc:
        return f"its promotion gate cannot be read ({str(exc).splitlines()[0]})"
    failed = [c.text for c in family_gate_checks(fam) if not c.ok]
    return "promotion gate: " + "; ".join(failed) if failed else None


def _folder_families(folder: Path) -> Mapping[str, Any] | None:
    from rlsched.learned.ppo import PolicyModel
    from rlsched.train.registry import card_families

    return card_families(PolicyModel.load(folder).card)


# ---------------------------------------------------------------------- decisions
@dataclass
class Advice:
    """What the twin concluded from its last replays.

    Attributes:
        best: the best policy of the last replay.
        gain: its mean JCT improvement over the served one (0.07: 7 % lower).
        wins: consecutive replays it won by the margin.
        action: ``none``, ``recommend``, ``switch`` or ``refused``.
        reason: one line saying why.
    """

    best: str
    gain: float
    wins: int
    action: str
    reason: str


class Hysteresis:
    """Consecutive wins of the same challenger by at least ``margin`` (see the module doc)."""

    def __init__(self) -> None:
        self.challenger = ""
        self.wins = 0

    def observe(self, result: TwinResult, margin: float) -> tuple[str, float, int]:
        """(best, gain, consecutive wins) after this replay; the count restarts when the best changes."""
        best = result.best()
        ratio = result.vs_served(best) if best in result.rows else math.nan
        gain = 1.0 - ratio if math.isfinite(ratio) else 0.0
        if best == result.served or gain < margin:
            self.challenger, self.wins = "", 0
        elif best == self.challenger:
            self.wins += 1
        else:
            self.challenger, self.wins = best, 1
        return best, gain, self.wins


class TwinMetrics:
    """The twin's Prometheus gauges, on the service's registry."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Gauge

        r = registry
        self.jct = Gauge("rlsched_twin_mean_jct_seconds", "Counterfactual mean JCT of the replayed history, by "
                         "policy (policy=actual: what really happened)", ["policy"], registry=r)
        self.wait = Gauge("rlsched_twin_mean_wait_seconds", "Counterfactual mean queue wait, by policy", ["policy"],
                          registry=r)
        self.cost = Gauge("rlsched_twin_cost_usd", "Counterfactual cost of the replayed history, by policy",
                          ["policy"], registry=r)
        self.misses = Gauge("rlsched_twin_deadline_misses", "Counterfactual deadline misses, by policy",
                            ["policy"], registry=r)
        self.vs_served = Gauge("rlsched_twin_jct_vs_served", "Counterfactual mean JCT over the served policy's",
                               ["policy"], registry=r)
        self.error = Gauge("rlsched_twin_simulator_error_ratio", "The served policy's counterfactual mean JCT over "
                           "the real one, minus 1 (the simulator's error on this cluster)", registry=r)
        self.jobs = Gauge("rlsched_twin_jobs", "Jobs in the last replay", registry=r)
        self.last_run = Gauge("rlsched_twin_last_run_timestamp_seconds", "When the last replay finished",
                              registry=r)

    def publish(self, result: TwinResult) -> None:
        for g in (self.jct, self.wait, self.cost, self.misses, self.vs_served):
            g.clear()
        for row in [*result.rows.values(), result.actual]:
            self.jct.labels(policy=row.policy).set(row.mean_jct_s)
            self.wait.labels(policy=row.policy).set(row.mean_wait_s)
            self.misses.labels(policy=row.policy).set(row.deadline_misses)
            if row.cost_usd is not None:
                self.cost.labels(policy=row.policy).set(row.cost_usd)
            if row.policy in result.rows:
                self.vs_served.labels(policy=row.policy).set(result.vs_served(row.policy))
        self.error.set(result.simulator_error())
        self.jobs.set(result.jobs)
        self.last_run.set(result.finished_at)


class DigitalTwin:
    """The twin of a running :class:`~rlsched.service.service.SchedulerService` (see the module doc).

    Args:
        service: the service whose history, spec, inventory and audit trail it uses.
        switch: how to serve another policy: ``switch(decl, reason, extra)`` (the service's
            :meth:`~rlsched.service.service.SchedulerService.serve_block`).
    """

    def __init__(self, service: SchedulerService,
                 switch: Callable[[PolicyDecl, str, dict[str, Any]], Any] | None = None) -> None:
        self.service = service
        self.metrics = TwinMetrics(service.metrics.registry)
        self.hysteresis = Hysteresis()
        self.switch = switch
        self.last: TwinResult | None = None
        self.advice: Advice | None = None
        #: one replay at a time (the schedule and an explicit run)
        self._running = threading.Lock()

    def run_once(self) -> TwinResult:
        """Replay now, publish the gauges and act on the block's ``adapt``; never holds the scheduling lock."""
        with self._running:
            svc = self.service
            spec, decl = svc.policy.spec, svc.policy.decl
            twin = decl.twin
            days = twin.days if twin is not None else 7.0
            svc.inventory.ensure()
            history = read_history(svc.config.db_path, since_s=days * 86400.0, now=svc.clock())
            result = run_twin(history, spec, decl, days=days, nodes=list(svc.inventory.nodes),
                              spec_paths=svc.config.spec_paths)
            self.metrics.publish(result)
            self.last = result
            self.advice = self._act(result, decl)
            return result

    def _act(self, result: TwinResult, decl: PolicyDecl) -> Advice | None:
        twin = decl.twin
        margin = twin.margin if twin is not None else 0.05
        best, gain, wins = self.hysteresis.observe(result, margin)
        if decl.adapt == "off" or wins < CONSECUTIVE_WINS:
            return Advice(best, gain, wins, "none", f"{best} is best" if best == result.served else
                          f"{best} beat {result.served} by {gain:.1%} on {wins} replay(s) in a row")
        why = (f"digital twin: {best} beat {result.served} by {gain:.1%} mean JCT on {wins} consecutive replays "
               f"of the last {result.days:g} days ({result.jobs} jobs; margin {margin:.0%})")
        refusal = gate_refusal(best, result.refs.get(best, best))
        extra = {"best": best, "served": result.served, "gain": round(gain, 4), "wins": wins,
                 "jobs": result.jobs, "simulator_error": round(result.simulator_error(), 4),
                 "table": {k: round(v.mean_jct_s, 3) for k, v in result.rows.items()}}
        from rlsched.runtime.audit import AuditEvent

        if refusal is not None or decl.adapt == "recommend" or self.switch is None:
            action = "refused" if refusal is not None else "recommend"
            reason = f"{why}; not served: {refusal}" if refusal else why
            self.service.store.append_audit(AuditEvent.TWIN_ADVICE, policy=result.served, reason=reason,
                                            extra={**extra, "action": action})
            return Advice(best, gain, wins, action, reason)
        ref = result.refs.get(best, best)
        new = (replace(decl, scheduler="rl", model=ref) if best.startswith("rl:")
               else replace(decl, scheduler=best, model=None))
        self.switch(new, why, extra)
        self.hysteresis = Hysteresis()
        return Advice(best, gain, wins, "switch", why)

    def loop(self, stopping: threading.Event) -> None:
        """Replay every ``twin.every`` of the served block (idle while it has no ``twin``), until ``stopping``."""
        while True:
            twin = self.service.policy.decl.twin
            if stopping.wait(twin.every_s if twin is not None else 60.0):
                return
            if self.service.policy.decl.twin is None:
                continue
            try:
                self.run_once()
            except TwinError as exc:
                LOG.info("twin: %s", exc)
            except Exception:
                LOG.exception("twin: the replay failed")


def _secs(x: float) -> str:
    """Seconds with three significant digits for short jobs, whole seconds for long ones."""
    if x < 10:
        return f"{x:.3f}"
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def advise_table(result: TwinResult) -> list[list[str]]:
    """Rows of ``rlsched advise``'s table: policy, mean JCT, wait, cost, misses, vs served (best first)."""
    rows = sorted(result.rows.values(), key=lambda r: (r.mean_jct_s, r.policy))
    out = []
    for r in rows:
        mark = " (served)" if r.policy == result.served else ""
        out.append([r.policy + mark, _secs(r.mean_jct_s), _secs(r.mean_wait_s),
                    "-" if r.cost_usd is None else f"{r.cost_usd:,.2f}", str(r.deadline_misses),
                    f"{result.vs_served(r.policy):.3f}x"])
    a = result.actual
    out.append(["actual (what happened)", _secs(a.mean_jct_s), _secs(a.mean_wait_s), "-",
                str(a.deadline_misses), "-"])
    return out
