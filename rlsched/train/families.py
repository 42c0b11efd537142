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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlsched.errors import RlschedError
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
        from rlsched.cluster.spec import parse_cluster
        from rlsched.market import default_market
        from rlsched.scenario import Scenario, apply_workload_options
        from rlsched.sim.engine import SimConfig

        pools = parse_cluster(self.cluster)
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
        from rlsched.cluster.spec import parse_cluster
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


Family = TraceFamily | GeneratorFamily

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
        TraceFamily("openb", "Alibaba openb default pods on 4 whole + 4 MIG A100 nodes, load 1.0",
                    "alibaba-gpu-v2023/openb_pod_list_default.csv", _MIG_FLEET, 1.0, 0.0, window_jobs=1000,
                    aliases=("openb-default-1500.csv",)),
        TraceFamily("openb-whole", "Alibaba openb default pods on 8 whole-GPU A100 nodes, load 1.2",
                    "alibaba-gpu-v2023/openb_pod_list_default.csv", "8x8xA100-80GB", 1.2, 0.0, window_jobs=1000,
                    aliases=("openb-default-1500.csv",)),
    ]


def families() -> dict[str, Family]:
    """Every evaluation family by name: trace families first, then generator families."""
    from rlsched.workload.generator import FAMILIES

    out: dict[str, Family] = {f.name: f for f in _trace_families()}
    for name, spec in FAMILIES.items():
        out[f"gen-{name}"] = GeneratorFamily(name, spec.description)
    return out


def resolve(names: Sequence[str]) -> list[Family]:
    """The named families (``all``, ``traces`` and ``generated`` are groups); FamilyError for unknown ones."""
    known = families()
    out: list[Family] = []
    for n in names:
        if n == "all":
            out.extend(known.values())
        elif n == "traces":
            out.extend(f for f in known.values() if f.kind == "trace")
        elif n == "generated":
            out.extend(f for f in known.values() if f.kind == "generator")
        elif n in known:
            out.append(known[n])
        else:
            import difflib

            close = difflib.get_close_matches(n, list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise FamilyError(f"unknown family {n!r}{hint}; known: all, traces, generated, {', '.join(known)}")
    seen: set[str] = set()
    return [f for f in out if not (f.name in seen or seen.add(f.name))]  # type: ignore[func-returns-value]


def family_key(f: Family) -> str:
    """The name tables and cards use (generator families carry a ``gen-`` prefix)."""
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


def generated_training_worlds(count: int, jobs: int, seed: int = 0, exclude: Sequence[str] = ()) -> list[World]:
    """Domain randomisation: ``count`` worlds, each a :func:`~rlsched.workload.generator.random_family` draw.

    World ``i`` is family ``random_family(seed + i, exclude)`` drawn with seed ``seed + i``
    (below 1000, so never an evaluation window of a generated family), ``jobs`` jobs
    long, on the family's own fleet and the bundled market.
    """
    import numpy as np

    from rlsched.cluster.spec import parse_cluster
    from rlsched.market import default_market
    from rlsched.scenario import Scenario
    from rlsched.sim.engine import SimConfig
    from rlsched.workload.generator import generate, random_family, with_overrides

    worlds = []
    for s in range(seed, seed + count):
        spec = random_family(np.random.default_rng(s), name=f"random{s}", exclude=exclude)
        spec = with_overrides(spec, jobs=jobs, backlog_jobs=min(spec.backlog_jobs, jobs // 4))
        tr = generate(spec, s)
        sc = Scenario(name=spec.name, pools=parse_cluster(spec.cluster), jobs=tr.jobs, market=default_market(),
                      sim=SimConfig(seed=s), source=tr.source)
        worlds.append(World(f"generated/{spec.name}[{spec.cluster}@{spec.load:.2f}]/train", sc, "generated",
                            0.0, 0.0, spec.load))
    return worlds


def trained_generator_families(exclude: Sequence[str]) -> list[str]:
    """The generator families whose kind domain randomisation covers when ``exclude`` is left out."""
    from rlsched.workload.generator import FAMILIES

    return [name for name in FAMILIES if name not in set(exclude)]
