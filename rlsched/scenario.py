"""Scenarios: pools + workload + market + world knobs, from YAML or the command line.

A scenario is what both ``rlsched simulate`` and the Gymnasium environment run.
Scenario files live in the top-level ``envs/`` folder; one is bundled in the
package (``bundled:default``) so that everything works with no arguments and no
data checkout.

YAML shape (every key but ``cluster`` and ``workload`` optional)::

    name: default
    cluster: "6x8xA100-80GB,2x8xA100-80GB/mig=balanced,spot:0-4x8xA100-80GB"
    gang: whole-nodes                      # or packed: every pool's gang mode (a pool's
                                           # own /gang=MODE in cluster is the other way)
    workload:
      - path: bundled:philly-3day.csv      # or a file path, relative to the YAML
        format: auto                       # auto|canonical|philly|openb|dlrm
        virtual_cluster: null              # Philly only
        max_jobs: null
    load_factor: 0.9                       # rescale arrivals to this offered load
    preemptible: trace                     # trace | all | none : who may use spot
    deadline_factor: null                  # deadline = submit + factor x duration (+ deadline_slack_s)
    deadline_slack_s: 0                    # extra slack on every deadline (provisioning, queueing)
    market: default                        # or {prices: FILE, availability: FILE, offset_s: 0,
                                           #     preemption: advisor | observed}
    sim: {seed: 0, checkpoint_interval_s: 1800, restart_overhead_s: 60, mig_reconfig_s: 60}

Offered load is measured against the cluster's *base* capacity: its on-prem GPUs,
or, for an all-elastic cluster, its maximum elastic GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from rlsched.cluster.job import Job
from rlsched.cluster.model import PoolKind, PoolSpec
from rlsched.cluster.shorthand import parse_cluster
from rlsched.errors import RlschedError, ScenarioError
from rlsched.market.base import Market
from rlsched.sim.engine import SimConfig
from rlsched.yamlfile import check_keys, load_mapping

_KEYS = {"name", "cluster", "gang", "workload", "load_factor", "preemptible", "deadline_factor", "deadline_slack_s",
         "market", "sim", "max_jobs", "description"}
_WORKLOAD_KEYS = {"path", "format", "virtual_cluster", "max_jobs", "skip_bad_rows"}
_SIM_KEYS = {"seed", "checkpoint_interval_s", "restart_overhead_s", "mig_reconfig_s", "oracle_durations",
             "timeline_points"}


@dataclass
class Scenario:
    """Everything one simulation needs.

    Attributes:
        name: label for reports.
        pools: the cluster.
        jobs: the workload (sorted by submission).
        market: prices and spot behaviour.
        sim: world knobs.
        source: where the workload came from (for reports and model cards).
    """

    name: str
    pools: list[PoolSpec]
    jobs: list[Job]
    market: Market
    sim: SimConfig = field(default_factory=SimConfig)
    source: str = ""

    def base_capacity(self) -> int:
        return base_capacity(self.pools)


def base_capacity(pools: list[PoolSpec]) -> int:
    """GPUs that offered load is measured against (on-prem, else maximum elastic)."""
    onprem = sum(p.max_nodes * p.gpus_per_node for p in pools if p.kind is PoolKind.ONPREM)
    return onprem or sum(p.max_nodes * p.gpus_per_node for p in pools)


def bundled_path(name: str) -> Path:
    """A file bundled in ``rlsched/data`` (traces/ or scenarios/)."""
    root = resources.files("rlsched") / "data"
    for sub in ("traces", "scenarios", ""):
        cand = Path(str(root / sub / name)) if sub else Path(str(root / name))
        if cand.exists():
            return cand
    raise ScenarioError(f"no bundled file {name!r}")


def _resolve(path: str, base: Path | None) -> Path:
    if path.startswith("bundled:"):
        return bundled_path(path.split(":", 1)[1])
    p = Path(path)
    if not p.is_absolute() and base is not None:
        p = base / p
    return p


def _check_keys(where: str, got: dict[str, Any], known: set[str]) -> None:
    check_keys(where, got, known, ScenarioError)


def apply_workload_options(
    jobs: list[Job],
    pools: list[PoolSpec],
    *,
    load_factor: float | None = None,
    preemptible: str = "trace",
    deadline_factor: float | None = None,
    max_jobs: int | None = None,
    deadline_slack_s: float = 0.0,
) -> list[Job]:
    """Shape a raw workload for a cluster: cut, rescale to a load, set spot eligibility and deadlines.

    ``deadline = submit + deadline_factor x duration + deadline_slack_s``. The additive
    slack exists because a pure multiple is shorter than a node's provisioning delay for
    short jobs (3 x a 60 s job), which no policy can meet on elastic capacity.
    """
    from rlsched.workload.trace import Trace
    from rlsched.workload.windows import scale_to_load, take

    jobs = sorted(jobs, key=lambda j: j.submit_time)
    if max_jobs is not None:
        if max_jobs < 1:
            raise ScenarioError(f"max_jobs must be >= 1, got {max_jobs}")
        jobs = take(Trace(jobs), max_jobs).jobs
    if load_factor is not None:
        if load_factor <= 0:
            raise ScenarioError(f"load factor must be > 0, got {load_factor}")
        if len(jobs) >= 2:
            jobs = scale_to_load(Trace(jobs), base_capacity(pools), load_factor).jobs
    if preemptible not in ("trace", "all", "none"):
        raise ScenarioError(f"preemptible must be trace, all or none, got {preemptible!r}")
    if preemptible != "trace":
        flag = preemptible == "all"
        jobs = [replace(j, preemptible=flag) for j in jobs]
    if deadline_factor is not None:
        if deadline_factor < 1:
            raise ScenarioError(f"deadline_factor must be >= 1, got {deadline_factor}")
        if deadline_slack_s < 0:
            raise ScenarioError(f"deadline_slack_s must be >= 0, got {deadline_slack_s}")
        jobs = [replace(j, deadline=j.submit_time + deadline_factor * j.duration + deadline_slack_s) for j in jobs]
    elif deadline_slack_s:
        raise ScenarioError("deadline_slack_s needs deadline_factor (it is added to factor x duration)")
    return jobs


def load_jobs(entries: list[dict[str, Any]], base: Path | None) -> tuple[list[Job], str]:
    """Read and merge workload entries (job ids are prefixed when several are merged)."""
    from rlsched.workload.formats import load_trace
    from rlsched.workload.trace import Trace
    from rlsched.workload.windows import take

    jobs: list[Job] = []
    sources = []
    for i, entry in enumerate(entries):
        _check_keys(f"workload[{i}]", entry, _WORKLOAD_KEYS)
        if "path" not in entry:
            raise ScenarioError(f"workload[{i}]: missing 'path'")
        path = _resolve(str(entry["path"]), base)
        tr = load_trace(str(path), entry.get("format", "auto"), skip_bad_rows=bool(entry.get("skip_bad_rows")),
                        virtual_cluster=entry.get("virtual_cluster"))
        part = tr.jobs
        if entry.get("max_jobs"):
            part = take(Trace(part), int(entry["max_jobs"])).jobs
        if len(entries) > 1:
            t0 = part[0].submit_time if part else 0.0
            part = [replace(j, job_id=f"w{i}-{j.job_id}", submit_time=j.submit_time - t0,
                            deadline=None if j.deadline is None else j.deadline - t0) for j in part]
        jobs.extend(part)
        sources.append(path.name)
    return jobs, "+".join(sources)


def load_scenario(spec: str | Path | dict[str, Any] | None = None) -> Scenario:
    """A scenario from a YAML path, ``bundled:NAME``, a dict, or None (the bundled default)."""
    base: Path | None = None
    if spec is None:
        spec = "bundled:default.yaml"
    if isinstance(spec, (str, Path)):
        s = str(spec)
        if s.startswith("bundled:"):
            name = s.split(":", 1)[1]
            path = bundled_path(name if name.endswith(".yaml") else name + ".yaml")
        else:
            path = Path(s)
        data = load_mapping(path, "scenario", ScenarioError)
        base = path.parent
        data.setdefault("name", path.stem)
    else:
        data = dict(spec)
    _check_keys("scenario", data, _KEYS)
    for req in ("cluster", "workload"):
        if req not in data:
            raise ScenarioError(f"scenario: missing required key {req!r}")
    pools = parse_cluster(str(data["cluster"]))
    if data.get("gang") is not None:
        pools = with_gang_mode(pools, data["gang"], str(data["cluster"]))
    entries = data["workload"] if isinstance(data["workload"], list) else [data["workload"]]
    jobs, source = load_jobs([e if isinstance(e, dict) else {"path": e} for e in entries], base)
    jobs = apply_workload_options(
        jobs, pools, load_factor=data.get("load_factor"), preemptible=str(data.get("preemptible", "trace")),
        deadline_factor=data.get("deadline_factor"), max_jobs=data.get("max_jobs"),
        deadline_slack_s=float(data.get("deadline_slack_s") or 0.0),
    )
    sim_cfg = data.get("sim") or {}
    _check_keys("sim", sim_cfg, _SIM_KEYS)
    market = build_market(data.get("market", "default"), pools, base)
    return Scenario(name=str(data.get("name", "scenario")), pools=pools, jobs=jobs, market=market,
                    sim=SimConfig(**sim_cfg), source=source)


def with_gang_mode(pools: list[PoolSpec], mode: object, cluster: str = "") -> list[PoolSpec]:
    """``pools`` with every pool's gang mode set to ``mode`` (the scenario's ``gang:`` key).

    A cluster string that already names a pool's mode (``/gang=``) and a ``gang:`` key
    together are refused: one of them would silently lose.
    """
    from rlsched.cluster.shorthand import parse_gang_mode

    if "gang=" in cluster.replace(" ", "").lower():
        raise ScenarioError("scenario: name the gang mode once - either the 'gang' key or /gang= in 'cluster'")
    try:
        gang = parse_gang_mode(mode)
    except RlschedError as exc:
        raise ScenarioError(f"scenario: gang: {exc}") from None
    return [replace(p, gang=gang) for p in pools]


def build_market(spec: Any, pools: list[PoolSpec], base: Path | None = None, offset_s: float = 0.0) -> Market:
    """The default market, or one from canonical price/availability files; checked against the pools."""
    from rlsched.market import default_market

    if spec in (None, "default"):
        market = default_market(offset_s)
    elif isinstance(spec, dict):
        _check_keys("market", spec, {"prices", "availability", "offset_s", "preemption"})
        # The bundled market with the parts the mapping names replaced.
        return override_market(
            default_market(), pools,
            prices=str(_resolve(spec["prices"], base)) if spec.get("prices") else None,
            availability=str(_resolve(spec["availability"], base)) if spec.get("availability") else None,
            offset_s=float(spec.get("offset_s", offset_s)), preemption=str(spec.get("preemption", "advisor")))
    else:
        raise ScenarioError(f"market must be 'default' or a mapping, got {spec!r}")
    market.check_pools(pools)
    return market


def override_market(market: Market, pools: list[PoolSpec], *, prices: str | None = None,
                    availability: str | None = None, offset_s: float | None = None,
                    preemption: str | None = None) -> Market:
    """``market`` with some of its parts replaced (``rlsched simulate``'s market flags over a scenario).

    What a flag does not name keeps the scenario's own value: ``--preemption observed``
    on a scenario with its own price file keeps that file, ``--market-offset`` keeps its
    preemption source. A market that is not table-based can only be replaced whole.
    """
    from rlsched.market import TableMarket, read_availability, read_prices
    from rlsched.market.defaults import preemption_models

    if not isinstance(market, TableMarket):
        spec: dict[str, Any] = {"offset_s": offset_s or 0.0, "preemption": preemption or "advisor"}
        if prices:
            spec["prices"] = prices
        if availability:
            spec["availability"] = availability
        return build_market(spec, pools)
    models, fallback = (preemption_models(preemption) if preemption is not None
                        else (market.preemption, market.fallback_preemption))
    out = TableMarket(
        read_prices(prices) if prices else market.prices,
        read_availability(availability) if availability else market.availability,
        models, fallback, offset_s=market.offset_s if offset_s is None else offset_s,
    )
    out.check_pools(pools)
    return out

