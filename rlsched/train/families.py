"""Evaluation *families*: groups of windows a model is judged on, real and generated.

A model that wins on the windows it was tuned on has shown nothing. The generalisation
benchmark (``benchmarks/generalisation.py``) and the promotion gate judge a model per
family of workloads, each family many windows:

* **trace families** cut windows from a real trace of ``../shared/data`` (Philly by
  period, fleet size and virtual cluster; the Alibaba openb pods on a MIG fleet and on
  whole GPUs), rescaled to a stated load on a stated fleet (the openb paper's resampled
  pod lists have no times or durations, so they cannot be replayed);
* **generator families** draw one trace per seed from a
  :class:`~rlsched.workload.generator.FamilySpec` (heavy tails, gangs, bursts, backlogs,
  fractional requests, fleets of 4-128 nodes).

:func:`exposure` says what a model has seen of a family, from its card: an
hour-windowed trace family is cut *around* every training and evaluation window of
the same trace (so it stays ``unseen``); a job-windowed trace family whose file the
model trained on is ``trained``, one it was evaluated on ``tuned``; a generator family
the experiment trained on is ``trained``. Only ``unseen`` families count towards a
verdict (leave-one-family-out).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlsched.errors import RlschedError, name_hint
from rlsched.train.worlds import World


class FamilyError(RlschedError):
    """An unknown family name, or a family whose data is missing."""


def data_dir() -> Path:
    """Where the real traces live: ``$RLSCHED_DATA``, else ``../shared/data`` of the repository."""
    env = os.environ.get("RLSCHED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


@dataclass(frozen=True)
class TraceFamily:
    """Windows of one real trace on one fleet.

    Attributes:
        name: family name.
        description: one line for tables.
        path: trace file relative to :func:`data_dir` (``bundled:NAME`` for a bundled one).
        cluster: the fleet (``--cluster`` syntax).
        load: offered load every window is rescaled to.
        window_h: window length in hours (``0``: windows of ``window_jobs`` consecutive jobs).
        start_h, end_h: the part of the trace windows are cut from (hours from its start;
            ``end_h <= 0`` = up to the end).
        window_jobs: jobs per window when ``window_h`` is 0; a cap otherwise.
        virtual_cluster: Philly only: keep one virtual cluster's jobs.
        anonymous: drop the tenant of every job (one anonymous user), as in the public traces
            that give only submission time, duration and GPU count: duration estimates can
            then learn only per GPU count, and fair share has one tenant to share among.
        fmt: the trace format (``auto`` detects).
        aliases: other file names holding (part of) the same trace, e.g. a bundled sample,
            so :func:`exposure` sees a model that trained on the sample.
    """

    name: str
    description: str
    path: str
    cluster: str
    load: float = 1.0
    window_h: float = 48.0
    start_h: float = 0.0
    end_h: float = 0.0
    window_jobs: int = 2000
    virtual_cluster: str | None = None
    anonymous: bool = False
    fmt: str = "auto"
    aliases: tuple[str, ...] = ()
    kind: str = "trace"

    def available(self) -> bool:
        return self.path.startswith("bundled:") or (data_dir() / self.path).is_file()

    def resolved(self) -> Path:
        if self.path.startswith("bundled:"):
            from rlsched.scenario import bundled_path

            return bundled_path(self.path.split(":", 1)[1])
        return data_dir() / self.path

    def windows(self, count: int, max_jobs: int | None = None,
                avoid: Sequence[tuple[float, float]] = ()) -> list[World]:
        """Up to ``count`` windows spread evenly over ``[start_h, end_h)``.

        Hour windows overlapping an ``avoid`` span (hours from the trace start: what a
        model trained or was selected on) are never cut, and neither are windows with
        fewer than :data:`MIN_WINDOW_JOBS` jobs (a trace's quiet first days). Job-count
        windows (``window_h == 0``) ignore ``avoid``: :func:`exposure` marks such a family
        seen as a whole (see :func:`exposure`).
        """
        from rlsched.workload.formats import load_trace
        from rlsched.workload.windows import take, window

        if not self.available():
            raise FamilyError(f"family {self.name!r}: trace {self.resolved()} not found (set RLSCHED_DATA)")
        trace = _cached_trace(str(self.resolved()), self.fmt, self.virtual_cluster, load_trace)
        t0 = trace.start
        span_h = (trace.last_submit - t0) / 3600.0
        hi = min(self.end_h, span_h) if self.end_h > 0 else span_h
        cap = max_jobs or self.window_jobs
        cuts: list[tuple[str, float, float, list[Any]]] = []
        if self.window_h > 0:
            import bisect

            submits = [j.submit_time for j in trace.jobs]
            grid, a = [], self.start_h
            while a + self.window_h <= hi:
                b = a + self.window_h
                n = bisect.bisect_left(submits, t0 + b * 3600.0) - bisect.bisect_left(submits, t0 + a * 3600.0)
                if n >= MIN_WINDOW_JOBS and not any(a < y and b > x for x, y in avoid):
                    grid.append(a)
                a += self.window_h / 4
            picks = _spread(grid, count, self.window_h)
            for a in picks:
                tr = window(trace, t0 + a * 3600.0, t0 + (a + self.window_h) * 3600.0)
                cuts.append((f"{a:.0f}-{a + self.window_h:.0f}h", a, a + self.window_h, take(tr, cap).jobs))
        else:
            jobs = [j for j in trace.jobs if self.start_h <= (j.submit_time - t0) / 3600.0 < hi]
            # Disjoint blocks of ``cap`` jobs, spread over the range (fewer than ``count`` if short).
            step_j = max((len(jobs) - cap) // max(count - 1, 1), cap)
            for i in range(count):
                part = jobs[i * step_j: i * step_j + cap]
                if len(part) < MIN_WINDOW_JOBS:
                    break
                base = part[0].submit_time
                part = [replace(j, submit_time=j.submit_time - base) for j in part]
                cuts.append((f"jobs {i * step_j}-{i * step_j + len(part)}", 0.0, 0.0, part))
        return [self._world(label, a, b, jobs) for label, a, b, jobs in cuts]

    def _world(self, label: str, a: float, b: float, jobs: list[Any]) -> World:
        from rlsched.cluster.shorthand import parse_cluster
        from rlsched.market import default_market
        from rlsched.scenario import Scenario, apply_workload_options
        from rlsched.sim.engine import SimConfig

        pools = parse_cluster(self.cluster)
        if self.anonymous:
            jobs = [replace(j, user="") for j in jobs]
        jobs = apply_workload_options(jobs, pools, load_factor=self.load)
        sc = Scenario(name=f"{self.name}[{label}]", pools=pools, jobs=jobs, market=default_market(),
                      sim=SimConfig(seed=0), source=f"{self.path}|{label}")
        return World(f"{self.name}/{label}", sc, self.name, a, b, self.load)


#: Windows with fewer jobs say nothing about scheduling (nobody waits).
MIN_WINDOW_JOBS = 100


def _spread(grid: list[float], count: int, length: float) -> list[float]:
    """Up to ``count`` starts from ``grid``, evenly spread, never overlapping each other."""
    if not grid:
        return []
    picks: list[float] = []
    n = len(grid)
    for i in range(count):
        a = grid[round(i * (n - 1) / max(count - 1, 1))]
        if all(abs(a - p) >= length for p in picks):
            picks.append(a)
    return picks


@dataclass(frozen=True)
class GeneratorFamily:
    """Windows drawn from a :class:`~rlsched.workload.generator.FamilySpec`, one per seed."""

    name: str
    description: str
    kind: str = "generator"

    def available(self) -> bool:
        return True

    def windows(self, count: int, max_jobs: int | None = None, avoid: Sequence[tuple[float, float]] = (),
                seed0: int = 1000) -> list[World]:
        """Seeds ``seed0 .. seed0 + count - 1`` (evaluation seeds; training draws below 1000).

        ``avoid`` is accepted for symmetry with :meth:`TraceFamily.windows` and unused: a
        generated family has no hours a model could have seen.
        """
        from rlsched.cluster.shorthand import parse_cluster
        from rlsched.market import default_market
        from rlsched.scenario import Scenario
        from rlsched.sim.engine import SimConfig
        from rlsched.workload.generator import family, with_overrides

        spec = family(self.name)
        if max_jobs:
            spec = with_overrides(spec, jobs=min(spec.jobs, max_jobs),
                                  backlog_jobs=min(spec.backlog_jobs, max_jobs // 5))
        pools = parse_cluster(spec.cluster)
        worlds = []
        for s in range(seed0, seed0 + count):
            from rlsched.workload.generator import generate

            tr = generate(spec, s)
            sc = Scenario(name=f"{self.name}[seed {s}]", pools=pools, jobs=tr.jobs, market=default_market(),
                          sim=SimConfig(seed=s), source=tr.source)
            worlds.append(World(f"{self.name}/seed{s}", sc, self.name, 0.0, 0.0, spec.load))
        return worlds


#: Markets spot families replay on besides generated ones: real price histories (see
#: ``benchmarks/cost_report.py``'s periods). ``prices`` is ``default`` (the bundled market)
#: or a canonical CSV relative to the repository; ``preemption`` the lifetime source.
@dataclass(frozen=True)
class RealMarket:
    """A real spot market at one point of its history."""

    description: str
    gpu: str
    prices: str = "default"
    preemption: str = "advisor"
    offset_s: float = 0.0

    def build(self, pools: list[Any]) -> Any:
        """The market for ``pools`` (checked against them)."""
        from rlsched.scenario import build_market

        spec: dict[str, Any] = {"offset_s": self.offset_s, "preemption": self.preemption}
        if self.prices != "default":
            spec["prices"] = str(_REPO / self.prices)
        return build_market(spec, pools)


_REPO = Path(__file__).resolve().parents[2]

REAL_MARKETS: dict[str, RealMarket] = {
    "real-gcp-h100-2025-03": RealMarket("GCP us-central1 H100, March 2025 (spot ~23% of on-demand), "
                                        "Spot Advisor reclaims", "H100-80GB", offset_s=24_700_000.0),
    "real-aws-v100-2020": RealMarket("AWS us-east-1 p3 V100 spot, Dec 2019 (~30% of list), observed 2020 "
                                     "lifetimes (reclaims every few hours)", "V100-16GB", preemption="observed"),
    "real-gcp-h100-us-east1": RealMarket("GCP us-east1 H100 from June 2024", "H100-80GB",
                                         prices="envs/markets/gcp-us-east1-2024-06.csv"),
    "real-gcp-a100-us-central1": RealMarket("GCP us-central1 A100-80GB from June 2024 (spot ~40% of on-demand)",
                                            "A100-80GB"),
}


@dataclass(frozen=True)
class SpotFamily:
    """Windows of a workload on a hybrid spot + on-demand fleet under one market family.

    Every job is preemptible (allowed on spot) with ``deadline = submit + deadline_factor
    x duration + deadline_slack_s``, and arrivals are rescaled to ``load`` of the fleet's
    maximum GPUs, as ``benchmarks/cost_report.py`` sets them. The fleet is elastic: one
    spot pool of ``spot_nodes`` per market region plus an on-demand pool
    (:func:`~rlsched.market.generator.spot_cluster`).

    Attributes:
        workload: ``gen:NAME`` (a :data:`~rlsched.workload.generator.FAMILIES` family,
            one draw per window seed) or the name of a trace family (its windows).
        market: a :data:`~rlsched.market.generator.MARKET_FAMILIES` name (one draw per
            window seed) or a :data:`REAL_MARKETS` name.
        gpu: the fleet's GPU model (a real market fixes its own).
    """

    name: str
    description: str
    workload: str
    market: str
    gpu: str = "H100-80GB"
    spot_nodes: int = 8
    ondemand_nodes: int = 8
    load: float = 0.4
    deadline_factor: float = 3.0
    deadline_slack_s: float = 3600.0
    kind: str = "spot"

    def available(self) -> bool:
        return self.workload.startswith("gen:") or _trace_family(self.workload).available()

    def cluster(self) -> str:
        from rlsched.market.generator import MarketSpec, market_family, spot_cluster

        spec = market_family(self.market) if self.market not in REAL_MARKETS else MarketSpec("real")
        return spot_cluster(spec, self.gpu, self.spot_nodes, self.ondemand_nodes)

    def windows(self, count: int, max_jobs: int | None = None, avoid: Sequence[tuple[float, float]] = (),
                seed0: int = 1000) -> list[World]:
        """``count`` windows: workload and market drawn with seeds ``seed0 ..`` (evaluation seeds).

        ``avoid`` (hours of the workload's trace a model saw) is passed to a trace workload.
        """
        from rlsched.cluster.shorthand import parse_cluster
        from rlsched.scenario import Scenario, apply_workload_options
        from rlsched.sim.engine import SimConfig

        pools = parse_cluster(self.cluster())
        if self.workload.startswith("gen:"):
            from rlsched.workload.generator import family, generate, with_overrides

            spec = family(self.workload[4:])
            if max_jobs:
                spec = with_overrides(spec, jobs=min(spec.jobs, max_jobs),
                                      backlog_jobs=min(spec.backlog_jobs, max_jobs // 5))
            cuts = [(f"seed{s}", s, generate(spec, s).jobs) for s in range(seed0, seed0 + count)]
        else:
            base = _trace_family(self.workload).windows(count, max_jobs, avoid=avoid)
            cuts = [(w.label.split("/", 1)[-1], seed0 + i, w.scenario.jobs) for i, w in enumerate(base)]
        worlds = []
        for label, seed, raw in cuts:
            jobs = apply_workload_options(raw, pools, load_factor=self.load, preemptible="all",
                                          deadline_factor=self.deadline_factor,
                                          deadline_slack_s=self.deadline_slack_s)
            market = self.market_for(pools, seed)
            sc = Scenario(name=f"{self.name}[{label}]", pools=pools, jobs=jobs, market=market,
                          sim=SimConfig(seed=seed), source=f"{self.workload}|{self.market}|{label}")
            worlds.append(World(f"{self.name}/{label}", sc, self.name, 0.0, 0.0, self.load))
        return worlds

    def market_for(self, pools: list[Any], seed: int) -> Any:
        """The window's market: a real one, or the market family's draw for ``seed``."""
        if self.market in REAL_MARKETS:
            return REAL_MARKETS[self.market].build(pools)
        from rlsched.market.generator import generate_market, market_family

        market = generate_market(market_family(self.market), seed, gpu_model=self.gpu,
                                 spot_nodes=self.spot_nodes).market()
        market.check_pools(pools)
        return market


def _spot_families() -> list[SpotFamily]:
    real = REAL_MARKETS
    return [
        SpotFamily("spot-cheap-stable", "generated steady workload, A100-80GB, mkt-cheap-stable", "gen:steady",
                   "mkt-cheap-stable", "A100-80GB"),
        SpotFamily("spot-expensive", "generated heavy-tail workload, H100, mkt-expensive", "gen:heavy-tail",
                   "mkt-expensive"),
        SpotFamily("spot-correlated-outages", "generated bursty workload, H100, mkt-correlated-outages",
                   "gen:bursty", "mkt-correlated-outages"),
        SpotFamily("spot-long-outages", "Alibaba openb pods, A100-80GB, mkt-long-outages", "openb",
                   "mkt-long-outages", "A100-80GB"),
        SpotFamily("spot-regional", "generated steady workload, H100, mkt-regional (3 spot pools of 4 nodes)",
                   "gen:steady", "mkt-regional", spot_nodes=4),
        SpotFamily("spot-volatile", "Philly (Dec 2017), V100, mkt-volatile", "philly-late", "mkt-volatile",
                   "V100-16GB"),
        SpotFamily("spot-real-gcp-h100-2025-03", f"Philly, {real['real-gcp-h100-2025-03'].description}",
                   "philly-early", "real-gcp-h100-2025-03", real["real-gcp-h100-2025-03"].gpu),
        SpotFamily("spot-real-aws-v100-2020", f"Alibaba openb pods, {real['real-aws-v100-2020'].description}",
                   "openb", "real-aws-v100-2020", real["real-aws-v100-2020"].gpu),
        SpotFamily("spot-real-gcp-h100-us-east1", f"Philly, {real['real-gcp-h100-us-east1'].description}",
                   "philly-early", "real-gcp-h100-us-east1", real["real-gcp-h100-us-east1"].gpu),
        SpotFamily("spot-real-gcp-a100-us-central1",
                   f"generated bursty workload, {real['real-gcp-a100-us-central1'].description}", "gen:bursty",
                   "real-gcp-a100-us-central1", real["real-gcp-a100-us-central1"].gpu),
    ]


def _trace_family(name: str) -> TraceFamily:
    """A trace family by name (a spot family's workload)."""
    for f in _trace_families():
        if f.name == name:
            return f
    raise FamilyError(f"unknown trace family {name!r} as a spot workload; "
                      f"known: {', '.join(f.name for f in _trace_families())}")


Family = TraceFamily | GeneratorFamily | SpotFamily

_PHILLY = "philly-2017/philly_jobs.csv"
_MIG_FLEET = "4x8xA100-80GB,4x8xA100-80GB/mig=balanced"


def _trace_families() -> list[TraceFamily]:
    return [
        TraceFamily("philly-early", "Philly Sep-Nov 2017 (hours 0-1800), 16 x 8 V100, load 1.0", _PHILLY,
                    "16x8xV100-16GB", 1.0, 48.0, 50.0, 1800.0),
        TraceFamily("philly-late", "Philly Dec 2017 (hours 1800-), 16 x 8 V100, load 1.25", _PHILLY,
                    "16x8xV100-16GB", 1.25, 48.0, 1800.0),
        TraceFamily("philly-small-fleet", "Philly, all periods, on 4 x 8 V100, load 1.0", _PHILLY,
                    "4x8xV100-16GB", 1.0, 48.0, 50.0),
        TraceFamily("philly-big-vc", "Philly's largest virtual cluster alone, 8 x 8 V100, load 1.0", _PHILLY,
                    "8x8xV100-16GB", 1.0, 48.0, 50.0, virtual_cluster="6214e9"),
        TraceFamily("philly-anon", "Philly, all periods, without tenants (submit, duration, GPUs only), "
                    "12 x 8 A100, load 0.9", _PHILLY, "12x8xA100-80GB", 0.9, 48.0, 50.0, anonymous=True),
        TraceFamily("openb", "Alibaba openb default pods on 4 whole + 4 MIG A100 nodes, load 1.0",
                    "alibaba-gpu-v2023/openb_pod_list_default.csv", _MIG_FLEET, 1.0, 0.0, window_jobs=1000,
                    aliases=("openb-default-1500.csv",)),
        TraceFamily("openb-whole", "Alibaba openb default pods on 8 whole-GPU A100 nodes, load 1.2",
                    "alibaba-gpu-v2023/openb_pod_list_default.csv", "8x8xA100-80GB", 1.2, 0.0, window_jobs=1000,
                    aliases=("openb-default-1500.csv",)),
    ]


def families() -> dict[str, Family]:
    """Every evaluation family by name: trace families, generator families, then spot families."""
    from rlsched.workload.generator import FAMILIES

    out: dict[str, Family] = {f.name: f for f in _trace_families()}
    for name, spec in FAMILIES.items():
        out[f"gen-{name}"] = GeneratorFamily(name, spec.description)
    for sf in _spot_families():
        out[sf.name] = sf
    return out


#: Groups :func:`resolve` understands: ``all`` is every on-prem family (traces and generated);
#: spot families need elastic pools and spot baselines, so they are a group of their own.
GROUPS = {"all": ("trace", "generator"), "traces": ("trace",), "generated": ("generator",), "spot": ("spot",)}


def resolve(names: Sequence[str]) -> list[Family]:
    """The named families (``all``, ``traces``, ``generated``, ``spot`` are groups); FamilyError for unknown ones."""
    known = families()
    out: list[Family] = []
    for n in names:
        if n in GROUPS:
            out.extend(f for f in known.values() if f.kind in GROUPS[n])
        elif n in known:
            out.append(known[n])
        else:
            raise FamilyError(f"unknown family {n!r}{name_hint(n, known)}; known: {', '.join(GROUPS)}, "
                              f"{', '.join(known)}")
    seen: set[str] = set()
    return [f for f in out if not (f.name in seen or seen.add(f.name))]  # type: ignore[func-returns-value]


def family_key(f: Family) -> str:
    """The name tables and cards use (generator families carry a ``gen-`` prefix, spot ones start ``spot-``)."""
    return f"gen-{f.name}" if f.kind == "generator" else f.name


def exposure(card: dict[str, Any], fam: Family,
             trace_files: Callable[[str], list[str]] | None = None) -> tuple[str, list[tuple[float, float]]]:
    """What a model (its card) has seen of a family: ``(status, spans to avoid)``.

    ``status`` is ``trained``, ``tuned`` or ``unseen`` (see the module docstring). For an
    hour-windowed trace family the spans (hours) of the same trace that the model trained
    or was evaluated on are returned, and :meth:`TraceFamily.windows` cuts around them,
    so the family stays ``unseen``. ``trace_files`` maps a card's scenario path to the
    trace file names it reads (default: parse the scenario YAML); injected by tests.
    """
    if isinstance(fam, SpotFamily):
        return _spot_exposure(card, fam, trace_files)
    if isinstance(fam, GeneratorFamily):
        trained = set(card.get("families", []) or [])
        return ("trained" if fam.name in trained or family_key(fam) in trained else "unseen"), []
    files = trace_files or _scenario_files
    names = {Path(fam.path.split(":", 1)[-1]).name, *fam.aliases}
    spans: list[tuple[str, float, float]] = []
    for group in ("scenarios", "holdout"):
        for entry in card.get(group, []) or []:
            if not names & set(files(str(entry.get("scenario", "")))):
                continue
            tw = entry.get("train_window_h")
            if tw:
                spans.append(("trained", float(tw[0]), float(tw[1])))
            spans.extend(("tuned", float(a), float(b)) for a, b in entry.get("eval_windows_h", []) or [])
            if not tw and not entry.get("eval_windows_h"):
                spans.append(("tuned", 0.0, float("inf")))
    if not spans:
        return "unseen", []
    if fam.window_h > 0:
        return "unseen", [(a, b) for _, a, b in spans]
    return ("trained" if any(k == "trained" for k, _, _ in spans) else "tuned"), []


_SEVERITY = {"unseen": 0, "tuned": 1, "trained": 2}


def _spot_exposure(card: dict[str, Any], fam: SpotFamily,
                   trace_files: Callable[[str], list[str]] | None) -> tuple[str, list[tuple[float, float]]]:
    """A spot family's exposure: the more seen of its market's and its workload's.

    A generated market family is ``trained`` when the card's ``market_families`` names it
    (domain-randomised training records the kinds it covered). A real market is
    ``trained`` when a training scenario of the card buys the same GPU model on the same
    price source with the same lifetime source, ``tuned`` when only a holdout scenario
    does (a different period of a market a model trained on still counts as seen). The
    workload's exposure is that of its generator or trace family (hour windows a model
    saw are avoided, so such a workload stays ``unseen``).
    """
    if fam.market in REAL_MARKETS:
        real = REAL_MARKETS[fam.market]
        market_status = "unseen"
        for group, status in (("holdout", "tuned"), ("scenarios", "trained")):
            for entry in card.get(group, []) or []:
                if _scenario_market(str(entry.get("scenario", ""))) == (real.prices, real.preemption, real.gpu):
                    market_status = status
    else:
        market_status = "trained" if fam.market in set(card.get("market_families", []) or []) else "unseen"
    if fam.workload.startswith("gen:"):
        wl_status, avoid = exposure(card, GeneratorFamily(fam.workload[4:], ""), trace_files)
    else:
        wl_status, avoid = exposure(card, _trace_family(fam.workload), trace_files)
    return max(market_status, wl_status, key=_SEVERITY.__getitem__), avoid


def _scenario_market(path: str) -> tuple[str, str, str] | None:
    """``(price source, preemption source, spot GPU model)`` a scenario YAML buys spot on (None: unreadable or no spot).

    The price source is ``default`` or the price file relative to the repository.
    """
    from rlsched.cluster.shorthand import parse_cluster
    from rlsched.yamlfile import load_mapping

    p = Path(path)
    if not p.is_absolute():
        p = _REPO / p
    try:
        data = load_mapping(p, "scenario", RlschedError)
        pools = parse_cluster(str(data.get("cluster", "")))
    except (RlschedError, OSError):
        return None
    from rlsched.cluster.model import PoolKind

    gpus = sorted({pool.model.name for pool in pools if pool.kind is PoolKind.SPOT})
    if not gpus:
        return None  # no spot pool: the scenario bought nothing on a spot market
    spec = data.get("market", "default")
    prices, preemption = "default", "advisor"
    if isinstance(spec, dict):
        preemption = str(spec.get("preemption", "advisor"))
        if spec.get("prices"):
            raw = (p.parent / str(spec["prices"])).resolve()
            try:
                prices = str(raw.relative_to(_REPO.resolve()))
            except ValueError:
                prices = str(raw)
    return prices, preemption, gpus[0] if len(gpus) == 1 else ",".join(gpus)


def is_spot_model(card: dict[str, Any]) -> bool:
    """Whether a model card describes a spot model: trained behind a deadline guard or on spot pools.

    Spot models are judged on spot families by the spot rule (deadline misses), on-prem
    models on JCT; the card says which by its training fleets (``spot:`` pools in a
    training world or scenario cluster) or its deadline-guard rule.
    """
    if card.get("deadline_guard"):
        return True
    worlds = [str(w) for w in card.get("training_worlds", []) or []]
    clusters = [str(c) for e in card.get("scenarios", []) or [] if isinstance(e, dict)
                for c in e.get("clusters", []) or []]
    return any("spot:" in x for x in worlds + clusters)


def _scenario_files(path: str) -> list[str]:
    """Trace file names a scenario YAML reads ([] when it cannot be read)."""
    from rlsched.yamlfile import load_mapping

    p = Path(path)
    if not p.is_absolute():
        p = Path(__file__).resolve().parents[2] / p
    try:
        data = load_mapping(p, "scenario", RlschedError)
    except (RlschedError, OSError):
        return []
    wl = data.get("workload", [])
    entries = wl if isinstance(wl, list) else [wl]
    out = []
    for e in entries:
        raw = e.get("path") if isinstance(e, dict) else e
        if raw:
            out.append(Path(str(raw).split(":", 1)[-1]).name)
    return out


_TRACE_CACHE: dict[tuple[str, str, str | None], Any] = {}


def _cached_trace(path: str, fmt: str, vc: str | None, loader: Any) -> Any:
    key = (path, fmt, vc)
    if key not in _TRACE_CACHE:
        _TRACE_CACHE[key] = loader(path, fmt, virtual_cluster=vc)
    return _TRACE_CACHE[key]


def generated_training_worlds(count: int, jobs: int, seed: int = 0, exclude: Sequence[str] = (),
                              max_nodes: int = 128) -> list[World]:
    """Domain randomisation: ``count`` worlds, each a :func:`~rlsched.workload.generator.random_family` draw.

    World ``i`` is family ``random_family(seed + i, exclude)`` drawn with seed ``seed + i``
    (below 1000, so never an evaluation window of a generated family), ``jobs`` jobs
    long, on the family's own fleet and the bundled market.
    """
    import numpy as np

    from rlsched.cluster.shorthand import parse_cluster
    from rlsched.market import default_market
    from rlsched.scenario import Scenario
    from rlsched.sim.engine import SimConfig
    from rlsched.workload.generator import generate, random_family, with_overrides

    worlds = []
    for s in range(seed, seed + count):
        spec = random_family(np.random.default_rng(s), name=f"random{s}", exclude=exclude, max_nodes=max_nodes)
        spec = with_overrides(spec, jobs=jobs, backlog_jobs=min(spec.backlog_jobs, jobs // 4))
        tr = generate(spec, s)
        sc = Scenario(name=spec.name, pools=parse_cluster(spec.cluster), jobs=tr.jobs, market=default_market(),
                      sim=SimConfig(seed=s), source=tr.source)
        worlds.append(World(f"generated/{spec.name}[{spec.cluster}@{spec.load:.2f}]/train", sc, "generated",
                            0.0, 0.0, spec.load))
    return worlds


def named_family_training_worlds(names: Sequence[str], count: int, jobs: int, seed: int = 0) -> list[World]:
    """``count`` draws (seeds ``seed ..``, below 1000) of each named generator family, ``jobs`` jobs long.

    The same draws as :meth:`GeneratorFamily.windows` with training seeds, labelled as training worlds.
    """
    out = []
    for name in names:
        for w in GeneratorFamily(name, "").windows(count, jobs, seed0=seed):
            out.append(replace(w, label=f"generated/{w.label}/train"))
    return out


def market_bases(base: Sequence[World]) -> list[tuple[World, Any]]:
    """The worlds of ``base`` a generated market can go under, each with its spot pool's spec.

    Those whose fleet is exactly one spot and one on-demand pool. Called before a training
    run fits its forecasters too, so an experiment without such a fleet is refused in a line
    before minutes of work. Raises :class:`FamilyError` when there is none.
    """
    from rlsched.cluster.model import PoolKind

    def spot_pool(w: World) -> Any:
        pools = w.scenario.pools
        if sorted(p.kind.value for p in pools) != sorted((PoolKind.SPOT.value, PoolKind.ONDEMAND.value)):
            return None  # not exactly one spot and one on-demand pool
        return next(p for p in pools if p.kind is PoolKind.SPOT)

    candidates = [(w, sp) for w in base if (sp := spot_pool(w)) is not None]
    if not candidates:
        raise FamilyError("generated_markets: no training world has a hybrid fleet of one spot and one on-demand "
                          "pool to put a generated market under")
    return candidates


def generated_market_training_worlds(base: Sequence[World], count: int, seed: int = 0,
                                     exclude: Sequence[str] = ()) -> list[World]:
    """Domain randomisation of markets: ``count`` copies of hybrid training worlds under drawn markets.

    Candidates are the worlds of ``base`` whose fleet is one elastic spot pool and one on-demand
    pool; the ``count`` worlds are spread evenly over them (jobs, fleet, simulator seed and
    forecaster unchanged) under :func:`~rlsched.market.generator.random_market` drawn with seed ``seed + i``
    (``exclude``'s kinds left out, one region: the fleet has one spot pool), generated for the
    spot pool's GPU model and size. Raises :class:`FamilyError` when ``base`` has no such fleet.
    """
    import numpy as np

    from rlsched.market.generator import generate_market, random_market, with_market_overrides

    candidates = market_bases(base)
    worlds = []
    n = len(candidates)
    for i in range(count):
        w, sp = candidates[i * n // count if count < n else i % n]  # spread over the fleets and GPU models
        s = seed + i
        spec = random_market(np.random.default_rng([s, 0x4D4B]), name=f"random-market{s}", exclude=exclude)
        spec = with_market_overrides(spec, regions=1, region_spread=0.0)
        market = generate_market(spec, s, gpu_model=sp.model.name, spot_nodes=sp.max_nodes).market()
        market.check_pools(w.scenario.pools)
        sc = replace(w.scenario, market=market, name=f"{w.scenario.name}[{spec.name}]",
                     source=f"{w.scenario.source}|{spec.name}")
        label = re.sub(r"@market\+[^@/]*", "", w.label.removesuffix("/train"))  # the real market's offset is moot
        worlds.append(replace(w, label=f"{label}@{spec.name}[spot {spec.spot_ratio:.2f}]/train", scenario=sc))
    return worlds


def trained_market_families(exclude: Sequence[str]) -> list[str]:
    """The market families whose kind :func:`generated_market_training_worlds` covers with ``exclude`` left out
    (never ``mkt-regional``: every draw has one region)."""
    from rlsched.market.generator import MARKET_FAMILIES

    return [name for name in MARKET_FAMILIES if name not in set(exclude) | {"mkt-regional"}]


def trained_generator_families(exclude: Sequence[str], max_nodes: int = 128, named: Sequence[str] = ()) -> list[str]:
    """The generator families whose kind domain randomisation covers when ``exclude`` is left out.

    Draws capped at ``max_nodes`` <= 32 nodes never have a large fleet, so ``large-fleet``
    stays unseen then - unless it is drawn by name (``named``).
    """
    from rlsched.workload.generator import FAMILIES

    out = (set(exclude) | ({"large-fleet"} if max_nodes <= 32 else set())) - set(named)
    return [name for name in FAMILIES if name not in out]
