"""Judge a policy per workload family against the best heuristic: the benchmark and the promotion gate.

One evaluation serves three readers: ``benchmarks/generalisation.py`` prints it,
a training run stores it in the model card, and ``rlsched promote`` refuses a
candidate that it condemns. Per family (:mod:`rlsched.train.families`) every window is
replayed under the candidate, every on-prem heuristic and SJF told the true durations
(a bound, never a competitor). The **best heuristic** of a family is the one with the
lowest mean over windows of its ratio to weighted-priority's mean JCT; the candidate
is judged by the mean over windows of ``candidate / best`` (a mean of ratios, so a
short window counts as much as a long one). A percentile-bootstrap interval over the windows
(:func:`bootstrap_interval`, the best heuristic re-picked in every resample) says how much of a
loss or a gain the windows' luck could make: where per-window ratios spread widely, a mean a few
percent above the best heuristic may be noise, and the verdict names the families where the whole
interval lies above parity (BENCHMARKS.md, "Which losses are real").

A candidate served behind rules (deadline guard, consolidation, long-job preemption)
is compared with every heuristic both bare and behind the *same* rules (``NAME+rules``),
and the best of all of them is the bar, so a gain is the network's and not the rules'.

The gate (:func:`family_checks`) refuses a candidate more than
:data:`GATE_TOLERANCE` (2%) worse than the best heuristic on any family it has not
seen; families it trained or was tuned on are reported but never count.

**Spot families** (hybrid spot + on-demand fleets under a generated or real market;
:class:`~rlsched.train.families.SpotFamily`) are judged on money and deadlines instead:
every window is replayed under the spot baselines (:data:`SPOT_BASELINES`; with a ruled
candidate also every spot baseline behind the same rules, the on-demand-only ones never)
and the candidate. Per family (:func:`summarise_spot`): each competitor's cost relative
to ``ondemand-autoscale`` (the on-demand-only reference; a mean of per-window ratios),
its deadline misses and lost GPU-hours (totals over the windows); the **best baseline**
is the cheapest among those with the fewest misses, the **cheapest baseline** the
cheapest regardless of misses. A candidate cloned from a codec-space teacher that is not a
registered heuristic (``sjf-spot-reserve``, the spot recipe's) also faces that teacher, behind the
same rules (``teacher:NAME+rules``), as one more baseline: a network must beat the heuristic it
imitates, or its training added nothing (BENCHMARKS.md, "The network against its own teacher");
a model of a spot teacher faces every other spot teacher too (:func:`teacher_baselines`).
The gate's spot rule: a candidate fails a spot family when it has more deadline misses than
the best baseline (lost GPU-hours and cost against the cheapest baseline are reported beside
it). A spot model (the card says so: :func:`~rlsched.train.families.is_spot_model`) must have
been judged on at least one unseen spot family.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from rlsched.train.families import Family, FamilyError, exposure, family_key

#: The on-prem heuristics every family is judged against (the spot baselines need elastic pools).
HEURISTICS = ("weighted-priority", "fifo", "sjf", "best-fit", "fgd", "fair-share", "tiresias")
BOUND = "sjf-oracle-bound"
CANDIDATE = "model"
#: How much worse than the best heuristic a candidate may be on an unseen family.
GATE_TOLERANCE = 0.02

#: Suffix of a heuristic run behind the candidate's rules.
RULED = "+rules"
#: Prefix of the candidate's behaviour-cloning teacher replayed as a spot baseline (:func:`cloned_teacher`).
TEACHER = "teacher:"

#: The baselines of a spot family (``benchmarks/cost_report.py``'s), the reference first.
SPOT_BASELINES = ("ondemand-autoscale", "ondemand-static", "spot-greedy", "spot-fallback", "uniform-progress")
#: On-demand-only baselines: never put behind rules (a reference, and a fleet provisioned for the peak).
ON_DEMAND_ONLY = ("ondemand-autoscale", "ondemand-static")
#: What spot costs are relative to.
ONDEMAND_REFERENCE = "ondemand-autoscale"
#: What a spot replay keeps.
SPOT_METRICS = ("cost_usd", "deadline_misses", "lost_gpu_hours", "mean_jct_s")

_WORLDS: list[Any] = []
_MODEL_REF: str | None = None
_MODEL: Any = None


@dataclass
class FamilyReport:
    """What one evaluation over families found.

    Attributes:
        summaries: ``{family: summary}`` (see :func:`summarise`).
        exposure: ``{family: "trained" | "tuned" | "unseen"}``.
        windows: ``{family: {window label: {competitor: mean JCT s}}}`` (on-prem families).
        spot_windows: ``{family: {window label: {competitor: {metric: value}}}}`` (spot
            families; metrics :data:`SPOT_METRICS`).
        skipped: ``{family: why it has no window}``.
        wall_s: seconds the replays took.
        choices: ``{family: {heuristic: choices}}`` - what a selector candidate chose, summed over the
            family's windows (empty for any other candidate): where it loses, which heuristic it trusted.
    """

    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    exposure: dict[str, str] = field(default_factory=dict)
    windows: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    spot_windows: dict[str, dict[str, dict[str, dict[str, float]]]] = field(default_factory=dict)
    choices: dict[str, dict[str, int]] = field(default_factory=dict)

    def is_spot(self, family: str) -> bool:
        """Whether ``family`` is judged on money and deadlines (it has spot windows, or a skipped
        spot family's name)."""
        return family in self.spot_windows or family.startswith("spot-")

    def to_json(self) -> dict[str, Any]:
        out = {"summary": self.summaries, "exposure": self.exposure, "windows": self.windows,
               "skipped": self.skipped, "wall_s": self.wall_s}
        if self.spot_windows:
            out["spot_windows"] = self.spot_windows
        if self.choices:
            out["choices"] = self.choices
        return out


def _init(worlds: list[Any], model_ref: str | None) -> None:
    global _WORLDS, _MODEL_REF, _MODEL
    if model_ref != _MODEL_REF:
        _MODEL = None  # a model already loaded for this ref (to read its rules) is kept
    _WORLDS, _MODEL_REF = worlds, model_ref


def _model() -> Any:
    """The candidate, loaded once per process (a replay must not pay torch's load time)."""
    global _MODEL
    if _MODEL is None:
        from rlsched.learned.ppo import load_policy_ref
        from rlsched.train.registry import download_model

        assert _MODEL_REF is not None
        _MODEL = load_policy_ref(_MODEL_REF, fetch=download_model)
    return _MODEL


#: What one replay gives: its mean JCT (a spot world: its :data:`SPOT_METRICS`), and how often a
#: selector candidate chose each of its heuristics (empty for everyone else).
Replayed = tuple[float | dict[str, float], dict[str, int]]


def _run(task: tuple[int, str, bool]) -> tuple[int, str, float | dict[str, float], dict[str, int]]:
    """Replay world ``i`` under one competitor (runs in worker processes too): ``(i, name, *Replayed)``."""
    i, name, spot = task
    return (i, name, *_replay(_WORLDS[i], name, spot, _model))


def _replay(world: Any, name: str, spot: bool, model: Callable[[], Any]) -> Replayed:
    """Replay ``world`` under competitor ``name`` (``model`` gives the candidate, asked only when needed)."""
    from rlsched.policies import make_policy
    from rlsched.train.evaluate import run_world

    choices: dict[str, int] = {}
    if name == BOUND:
        rep = run_world(world, make_policy("sjf"), oracle_durations=True)
    else:
        sched = competitor_scheduler(name, model)
        rep = run_world(world, sched)
        if name == CANDIDATE:
            choices = dict(getattr(sched, "choices", None) or {})  # a selector counts its choices ...
            # ... and the network's preferences its safe default overruled (keys apart: see choice_lines)
            choices.update({OVERRULED + h: c for h, c in (getattr(sched, "overruled", None) or {}).items()})
    result = rep.result()
    if spot:
        return {k: float(result[k]) for k in SPOT_METRICS}, choices
    return float(result["mean_jct_s"]), choices


def competitor_scheduler(name: str, model: Callable[[], Any]) -> Any:
    """A fresh scheduler for competitor ``name`` (any of :func:`competitors` but the bound).

    ``model`` gives the loaded candidate, asked only when the name needs it: the candidate
    itself, ``NAME+rules`` (a heuristic behind the candidate's served rules) and
    ``teacher:RULE[+rules]``. The cost report builds its rows with this too, so every
    comparison puts the same schedulers beside a model.
    """
    from rlsched.policies import make_policy

    if name == CANDIDATE:
        return model().scheduler(CANDIDATE)
    if name.startswith(TEACHER):
        return _teacher_scheduler(model(), name)
    if name.endswith(RULED):
        from rlsched.policies.rules import RuledScheduler

        return RuledScheduler(make_policy(name[: -len(RULED)]), model().new_rules())
    return make_policy(name)


def _teacher_scheduler(model: Any, name: str) -> Any:
    """``teacher:RULE[+rules]`` for ``model``: the teacher through the model's codec shape, behind the
    rules the model is served with (when the name says so), as the training's final evaluation runs it."""
    from rlsched.train.teacher import TeacherScheduler

    ruled = name.endswith(RULED)
    rule = name.removeprefix(TEACHER).removesuffix(RULED)
    p = model.codec_params
    sched = TeacherScheduler(rule, p["window"], p["max_pools"], rules=model.rule_params if ruled else None,
                             nominators=tuple(p.get("nominators", ())), preempt_slots=p.get("preempt_slots", 0))
    sched.name = name
    return sched


def _ray_replay(world: Any, name: str, spot: bool, model: Any) -> Replayed:
    """:func:`_replay` as a Ray task: the world and the loaded candidate come from the object store."""
    return _replay(world, name, spot, lambda: model)


def _run_on_ray(address: str, worlds: list[Any], tasks: list[tuple[int, str, bool]], model: Any,
                done: Callable[[int, str, float | dict[str, float], dict[str, int]], None]) -> None:
    """Every task as a Ray task on the cluster at ``address``; ``done`` gets each result as it arrives.

    Each world and the candidate go to the object store once; the candidate travels loaded (not as
    its folder path), so a node without the model folder replays it too.
    """
    import ray

    from rlsched.ray_connect import connect

    connect(address)
    world_refs = [ray.put(w) for w in worlds]
    model_ref = ray.put(model)
    remote = ray.remote(_ray_replay).options(num_cpus=1, max_retries=0)
    pending = {remote.remote(world_refs[i], n, spot, model_ref): (i, n) for i, n, spot in tasks}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i, n = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                cause = getattr(exc, "cause", None) or exc
                lines = [ln for ln in str(cause).strip().splitlines() if ln.strip()]
                raise FamilyError(f"replay of {worlds[i].label} under {n} failed on Ray: "
                                  f"{lines[-1] if lines else type(cause).__name__}") from None
            done(i, n, *result)
    finally:
        for ref in pending:  # only tasks not yet collected (none unless a replay failed)
            ray.cancel(ref)


def cloned_teacher(card: dict[str, Any]) -> str | None:
    """The codec-space teacher a model was anchored to or cloned from, when it is a heuristic of its own
    (None otherwise).

    ``sjf-spot-first`` is one: a cost policy no registered baseline reproduces. A registered
    heuristic's name (``sjf``, ``weighted-priority``) is left out - its own, unwindowed, row is
    already there - and so are the teachers that pick or follow others, and selector labels.
    """
    from rlsched.policies import available
    from rlsched.train.teacher import PICKERS, TEACHERS

    name = card.get("anchor") or (card.get("behaviour_cloning") or {}).get("teacher")
    if not isinstance(name, str) or name not in TEACHERS or name in PICKERS or name in available():
        return None
    return name


def teacher_baselines(card: dict[str, Any]) -> list[str]:
    """The codec-space teachers a model faces as baselines: its own (:func:`cloned_teacher`) and, when
    that is a spot teacher, every other spot teacher too (:data:`~rlsched.envs.teacher_actions.SPOT_TEACHERS`).

    A model anchored to a newer spot teacher must still beat the older one: dropping the teacher that
    was the cheapest baseline on four unseen families when the recipe changed would lower the bar.
    """
    from rlsched.envs.teacher_actions import with_spot_teachers

    own = cloned_teacher(card)
    return [] if own is None else with_spot_teachers([own])


def competitors(spot: bool, model_ref: str | None, ruled: bool, teachers: Sequence[str] = ()) -> list[str]:
    """Who replays a world: on-prem heuristics and the bound, or the spot baselines; then the candidate.

    ``ruled`` (the candidate has rules) adds every heuristic behind the same rules
    (on a spot family every spot baseline but the on-demand-only ones). ``teachers``
    (:func:`teacher_baselines`) adds those teachers on spot families, behind the
    candidate's rules when it has any.
    """
    if spot:
        names = list(SPOT_BASELINES)
        if model_ref and ruled:
            names += [b + RULED for b in SPOT_BASELINES if b not in ON_DEMAND_ONLY]
        if model_ref:
            names += [TEACHER + t + (RULED if ruled else "") for t in teachers]
    else:
        names = [*HEURISTICS, BOUND]
        if model_ref and ruled:
            names += [h + RULED for h in HEURISTICS]
    return names + ([CANDIDATE] if model_ref else [])


def evaluate_families(
    fams: Sequence[Family],
    model_ref: str | None,
    *,
    card: dict[str, Any] | None = None,
    windows: int = 6,
    max_jobs: int = 2000,
    processes: int | None = 1,
    progress: Callable[[int, int, float], None] | None = None,
    ray: str | None = None,
) -> FamilyReport:
    """Replay every family's windows under the candidate (``model_ref``; None: heuristics only).

    The replays run in this process, in ``processes`` worker processes (None: as many as
    :func:`local_processes` finds worth starting), or with ``ray`` (a Ray address, ``auto`` or
    ``HOST:PORT``) as one Ray task each over the cluster; every replay is deterministic, so all
    three give the same numbers.

    ``card`` is the candidate's model card: windows of traces it saw are not cut and
    its exposure to each family is recorded. Families whose data is missing are
    ``skipped`` with the reason, never an error.
    """
    report = FamilyReport()
    worlds: list[Any] = []
    fam_of: list[str] = []
    spot_of: list[bool] = []
    for f in fams:
        key = family_key(f)
        status, avoid = exposure(card or {}, f)
        report.exposure[key] = status
        try:
            ws = f.windows(windows, max_jobs, avoid=avoid)
        except FamilyError as exc:
            report.skipped[key] = str(exc)
            continue
        if not ws:
            report.skipped[key] = "no window the model has not seen" if avoid else "no window with enough jobs"
        worlds.extend(ws)
        fam_of.extend([key] * len(ws))
        spot_of.extend([f.kind == "spot"] * len(ws))
    ruled = False
    teachers: list[str] = []
    if model_ref:
        _init([], model_ref)
        ruled = bool(_model().new_rules())
        teachers = teacher_baselines(_model().card)  # both kinds of model folder have a card ({} when absent)
        forecast = getattr(_model(), "forecast", None)
        if forecast is not None:
            # Spot replays run with the model's demand forecaster, every competitor alike
            # (as ``rlsched simulate`` and the cost report do): its policy reads the forecast.
            worlds = [replace(w, forecaster=forecast.forecaster, forecast_horizon_s=forecast.horizon_s)
                      if spot_of[i] else w for i, w in enumerate(worlds)]
    tasks = [(i, n, spot_of[i]) for i in range(len(worlds))
             for n in competitors(spot_of[i], model_ref, ruled, teachers)]
    t0 = time.perf_counter()
    procs = local_processes(len(tasks)) if processes is None else processes
    results, choices = _replay_all(worlds, tasks, model_ref, processes=procs, ray=ray, progress=progress)
    report.wall_s = time.perf_counter() - t0
    for i, w in enumerate(worlds):
        target: dict[str, Any] = report.spot_windows if spot_of[i] else report.windows
        target.setdefault(fam_of[i], {})[w.label] = results[i]
        for heuristic, count in choices.get(i, {}).items():
            fam = report.choices.setdefault(fam_of[i], {})
            fam[heuristic] = fam.get(heuristic, 0) + count
    report.summaries = {f: summarise(rows) for f, rows in report.windows.items()}
    report.summaries.update({f: summarise_spot(rows) for f, rows in report.spot_windows.items()})
    return report


#: replays a worker process must have to repay its start (importing the package, loading the model)
REPLAYS_PER_PROCESS = 40


def local_processes(replays: int) -> int:
    """Worker processes worth starting on this machine for ``replays`` replays: one per CPU this
    process may use (at most 8), fewer when each would get under :data:`REPLAYS_PER_PROCESS`;
    1 means replay here."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, 8, replays // REPLAYS_PER_PROCESS))


def _replay_all(worlds: list[Any], tasks: list[tuple[int, str, bool]], model_ref: str | None, *, processes: int,
                ray: str | None, progress: Callable[[int, int, float], None] | None
                ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, int]]]:
    """Every task's result, ``{world index: {competitor: result}}``, and the candidate's choices per world
    (a selector's; ``{world index: {heuristic: count}}``): on Ray, in a process pool or here."""
    results: dict[int, dict[str, Any]] = {}
    choices: dict[int, dict[str, int]] = {}
    t0 = time.perf_counter()
    finished = 0

    def record(i: int, n: str, r: float | dict[str, float], chosen: dict[str, int]) -> None:
        nonlocal finished
        finished += 1
        results.setdefault(i, {})[n] = r
        if chosen:
            choices[i] = chosen
        if progress is not None:
            progress(finished, len(tasks), time.perf_counter() - t0)

    if ray is not None and tasks:
        _run_on_ray(ray, worlds, tasks, _model() if model_ref else None, record)
    elif processes > 1 and len(tasks) > 1:
        # spawned, not forked: a training run's gate starts workers from a process that has run torch's
        # thread pools, which a fork would copy mid-flight (workers import the package and load the model)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(processes, mp_context=spawn, initializer=_init,
                                 initargs=(worlds, model_ref)) as pool:
            for i, n, r, chosen in pool.map(_run, tasks, chunksize=1):
                record(i, n, r, chosen)
    else:
        _init(worlds, model_ref)
        for task in tasks:
            record(*_run(task))
    return results, choices


def summarise(per_window: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A family's summary from ``{window: {competitor: mean JCT}}`` (see the module docstring).

    Keys: ``windows``, ``best`` (heuristic), ``best_vs_wp``, ``heuristics_vs_wp``,
    ``bound_vs_wp`` (every competitor but the bound and the candidate is a heuristic,
    ``NAME+rules`` ones included) and, with a candidate, ``model_vs_best`` (mean of per-window
    ratios) with its ``_min`` / ``_max``, ``model_no_worse`` (windows) and ``model_vs_wp``.

    Two headroom figures say how far below the best heuristic any policy could be expected to
    get, so a missed target shows its cause: ``hindsight_vs_best``, each window's best
    heuristic picked after the fact (what a perfect choice of one heuristic per window gains
    over the family's single best), and ``bound_vs_best``, SJF told the true durations
    (what ordering by information no scheduler has gains); both means of per-window ratios.
    """
    labels = [w for w, row in per_window.items() if row.get("weighted-priority", 0) > 0]
    if not labels:
        return {"windows": 0}
    first = per_window[labels[0]]

    def vs(a: str, b: str) -> list[float]:
        return [per_window[w][a] / per_window[w][b] for w in labels if per_window[w][b] > 0]

    heur = {h: statistics.fmean(vs(h, "weighted-priority")) for h in first if h not in (BOUND, CANDIDATE)}
    best = min(heur, key=lambda h: (heur[h], h))
    out: dict[str, Any] = {
        "windows": len(labels), "best": best, "best_vs_wp": heur[best], "heuristics_vs_wp": heur,
        "bound_vs_wp": statistics.fmean(vs(BOUND, "weighted-priority")) if BOUND in first else None,
        "bound_vs_best": statistics.fmean(vs(BOUND, best)) if BOUND in first else None,
        "hindsight_vs_best": statistics.fmean(
            min(per_window[w][h] for h in heur) / per_window[w][best] for w in labels if per_window[w][best] > 0),
    }
    if CANDIDATE in first:
        r = vs(CANDIDATE, best)
        lo, hi = bootstrap_interval(per_window, labels, list(heur))
        out.update({
            "model_vs_best": statistics.fmean(r), "model_vs_best_min": min(r), "model_vs_best_max": max(r),
            "model_vs_best_lo": lo, "model_vs_best_hi": hi,
            "model_no_worse": sum(x <= 1.0 + 1e-9 for x in r),
            "model_vs_wp": statistics.fmean(vs(CANDIDATE, "weighted-priority")),
        })
    return out


#: Resamples behind :func:`bootstrap_interval` (fixed, and so is the seed: a report is reproducible).
BOOTSTRAP_RESAMPLES = 2000


def bootstrap_interval(per_window: dict[str, dict[str, float]], labels: Sequence[str], heuristics: Sequence[str],
                       level: float = 0.95) -> tuple[float, float]:
    """A percentile-bootstrap interval of the candidate's mean ratio to the family's best heuristic.

    Windows are resampled with replacement, and in every resample the best heuristic is picked
    again (the lowest mean ratio to weighted-priority over that resample), exactly as
    :func:`summarise` picks it. Re-picking matters: the family's best heuristic is chosen on the
    same few windows it is then compared on, so a minimum over several noisy means is optimistic,
    and an interval that held the pick fixed would hide that. With a handful of windows whose ratios
    spread widely, the interval says whether a small loss is a loss or the windows' luck.
    """
    import numpy as np

    rows = [w for w in labels if all(per_window[w].get(h, 0) > 0 for h in heuristics)
            and per_window[w].get(CANDIDATE, 0) > 0]
    if not rows:
        return float("nan"), float("nan")
    jct = np.array([[per_window[w][h] for h in heuristics] for w in rows])  # windows x heuristics
    model = np.array([per_window[w][CANDIDATE] for w in rows])
    wp = np.array([per_window[w]["weighted-priority"] for w in rows])
    vs_wp = jct / wp[:, None]
    return _resampled_interval(model, jct, lambda idx: vs_wp[idx].mean(axis=1).argmin(axis=1), level)


def _resampled_interval(model: Any, against: Any, pick: Callable[[Any], Any], level: float) -> tuple[float, float]:
    """The percentile-bootstrap interval of ``mean(model / against[:, best])`` over resampled windows.

    ``model`` holds the candidate's value per window, ``against`` every competitor's (windows x
    competitors); ``pick`` maps the resamples' window indices (resamples x windows) to the
    competitor each resample calls best - the table's own rule applied to the resample.
    """
    import numpy as np

    idx = np.random.default_rng(0).integers(0, len(model), size=(BOOTSTRAP_RESAMPLES, len(model)))
    best = pick(idx)
    ratios = (model[:, None] / against)[idx, best[:, None]].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def spot_bootstrap_interval(per_window: dict[str, dict[str, dict[str, float]]], labels: Sequence[str],
                            baselines: Sequence[str], level: float = 0.95) -> tuple[float, float]:
    """A percentile-bootstrap interval of the candidate's mean cost ratio to a spot family's best baseline.

    As :func:`bootstrap_interval`, with :func:`summarise_spot`'s rule re-applied in every resample:
    the best baseline is the cheapest (mean cost vs on-demand-only) of those with the fewest deadline
    misses over the resampled windows. A spot family's cost ratios spread widely from window to window
    (a market's outages fall in some windows and not others), so a mean over four windows alone cannot
    say whether a model is dearer than the best baseline or was unlucky.
    """
    import numpy as np

    rows = [w for w in labels if per_window[w].get(CANDIDATE, {}).get("cost_usd", 0) > 0
            and all(per_window[w][b]["cost_usd"] > 0 for b in baselines)]
    if not rows:
        return float("nan"), float("nan")
    cost = np.array([[per_window[w][b]["cost_usd"] for b in baselines] for w in rows])
    misses = np.array([[per_window[w][b]["deadline_misses"] for b in baselines] for w in rows])
    od = np.array([per_window[w][ONDEMAND_REFERENCE]["cost_usd"] for w in rows])
    model = np.array([per_window[w][CANDIDATE]["cost_usd"] for w in rows])
    vs_od = cost / od[:, None]
    # fewest misses first, then cheapest: misses are whole numbers, so a step larger than any mean
    # cost ratio keeps the order lexicographic
    step = float(vs_od.max()) + 1.0
    return _resampled_interval(
        model, cost, lambda idx: (misses[idx].sum(axis=1) * step + vs_od[idx].mean(axis=1)).argmin(axis=1), level)


def hindsight_picks(per_window: dict[str, dict[str, dict[str, float]]], labels: Sequence[str],
                    baselines: Sequence[str], best: str) -> list[str]:
    """Each window's baseline picked after the fact: the cheapest there among ``baselines`` with no more
    deadline misses there than ``best`` (ties: by name).

    A spot family's headroom, as ``hindsight_vs_best`` is an on-prem family's: what a perfect choice of one
    baseline per window would cost. Where it costs at least as much as the cheapest baseline, no choice
    among the baselines meets issue 16's two spot targets together (no more misses than the best baseline,
    a cost at most the cheapest's) - the cheapest saves by missing deadlines - and only a policy that beats
    every baseline in some window can.
    """
    picks = []
    for w in labels:
        row = per_window[w]
        cap = row[best]["deadline_misses"]
        picks.append(min((n for n in baselines if row[n]["deadline_misses"] <= cap),
                         key=lambda n: (row[n]["cost_usd"], n)))
    return picks


def spot_totals(per_window: dict[str, dict[str, dict[str, float]]], labels: Sequence[str],
                name: str) -> dict[str, Any]:
    """``name``'s totals over the windows ``labels`` (each with an on-demand-only cost above 0): ``cost_vs_od``
    (a mean of per-window ratios to :data:`ONDEMAND_REFERENCE`), ``misses`` and ``lost_gpu_h`` (sums).

    One definition for the family benchmark and the training-side grid, so a cell means the same in both.
    """
    od = ONDEMAND_REFERENCE
    return {"cost_vs_od": statistics.fmean(per_window[w][name]["cost_usd"] / per_window[w][od]["cost_usd"]
                                           for w in labels),
            "misses": int(sum(per_window[w][name]["deadline_misses"] for w in labels)),
            "lost_gpu_h": sum(per_window[w][name]["lost_gpu_hours"] for w in labels)}


def best_spot_baseline(totals: dict[str, dict[str, Any]]) -> str:
    """The best of some spot baselines' :func:`spot_totals`: the fewest deadline misses, then the cheapest.

    Deadlines come first because a miss is a broken promise to a user and a saving is not; ties go by name
    so the pick is the same on every machine.
    """
    return min(totals, key=lambda n: (totals[n]["misses"], totals[n]["cost_vs_od"], n))


def summarise_spot(per_window: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """A spot family's summary from ``{window: {competitor: {metric: value}}}`` (see the module docstring).

    Keys: ``kind`` (``"spot"``), ``windows``, ``baselines`` (``{name: {cost_vs_od,
    misses, lost_gpu_h}}``), ``best`` (the cheapest of the baselines with the fewest
    misses) with ``best_cost_vs_od`` / ``best_misses`` / ``best_lost_gpu_h``, ``cheapest``
    with ``cheapest_cost_vs_od``; the headroom ``hindsight_cost_vs_best`` / ``hindsight_cost_vs_cheapest``
    (each window's :func:`hindsight_picks` against the best and the cheapest baseline there, means of
    per-window ratios); with a candidate ``model_cost_vs_od``,
    ``model_cost_vs_best`` (mean of per-window ratios) with its ``_min`` / ``_max`` and its 95%
    interval ``_lo`` / ``_hi`` (:func:`spot_bootstrap_interval`),
    ``model_cost_vs_cheapest``, ``model_misses``, ``model_lost_gpu_h``, ``model_jct_vs_best``
    and ``model_no_more_misses`` (windows where it missed no more than the best baseline).
    """
    labels = [w for w, row in per_window.items() if row.get(ONDEMAND_REFERENCE, {}).get("cost_usd", 0) > 0]
    if not labels:
        return {"kind": "spot", "windows": 0}
    first = per_window[labels[0]]

    def ratios(a: str, b: str, metric: str = "cost_usd") -> list[float]:
        return [per_window[w][a][metric] / per_window[w][b][metric] for w in labels
                if per_window[w][b][metric] > 0]

    base = {n: spot_totals(per_window, labels, n) for n in first if n != CANDIDATE}
    best = best_spot_baseline(base)
    cheapest = min(base, key=lambda n: (base[n]["cost_vs_od"], n))
    out: dict[str, Any] = {
        "kind": "spot", "windows": len(labels), "baselines": base,
        "best": best, "best_cost_vs_od": base[best]["cost_vs_od"], "best_misses": base[best]["misses"],
        "best_lost_gpu_h": base[best]["lost_gpu_h"],
        "cheapest": cheapest, "cheapest_cost_vs_od": base[cheapest]["cost_vs_od"],
    }
    picks = hindsight_picks(per_window, labels, list(base), best)
    for key, ref in (("hindsight_cost_vs_best", best), ("hindsight_cost_vs_cheapest", cheapest)):
        vs_ref = [per_window[w][pick]["cost_usd"] / per_window[w][ref]["cost_usd"]
                  for w, pick in zip(labels, picks, strict=True) if per_window[w][ref]["cost_usd"] > 0]
        out[key] = statistics.fmean(vs_ref) if vs_ref else None
    if CANDIDATE in first:
        mine = spot_totals(per_window, labels, CANDIDATE)
        vs_best = ratios(CANDIDATE, best)
        jct = ratios(CANDIDATE, best, "mean_jct_s")
        out.update({
            "model_cost_vs_od": mine["cost_vs_od"], "model_cost_vs_best": statistics.fmean(vs_best),
            "model_cost_vs_best_min": min(vs_best), "model_cost_vs_best_max": max(vs_best),
            **dict(zip(("model_cost_vs_best_lo", "model_cost_vs_best_hi"),
                       spot_bootstrap_interval(per_window, labels, list(base)), strict=True)),
            "model_cost_vs_cheapest": statistics.fmean(ratios(CANDIDATE, cheapest)),
            "model_misses": mine["misses"], "model_lost_gpu_h": mine["lost_gpu_h"],
            "model_jct_vs_best": statistics.fmean(jct) if jct else None,
            "model_no_more_misses": sum(per_window[w][CANDIDATE]["deadline_misses"]
                                        <= per_window[w][best]["deadline_misses"] for w in labels),
        })
    return out


def _is_spot(summary: dict[str, Any]) -> bool:
    return summary.get("kind") == "spot"


def family_checks(summaries: dict[str, dict[str, Any]], exposure_of: dict[str, str],
                  tolerance: float = GATE_TOLERANCE, *, spot_model: bool = False) -> list[tuple[bool, str]]:
    """The promotion gate: ``(ok, text)`` per unseen family with a candidate result.

    On-prem families: mean JCT at most ``1 + tolerance`` times the best heuristic's. Spot
    families: no more deadline misses than the best baseline (lost GPU-hours and cost
    against the cheapest baseline are reported in the text). No unseen family at all is
    itself a failed check, and so is a ``spot_model`` judged on no unseen spot family:
    a gate that judged nothing must not let a candidate through.
    """
    out: list[tuple[bool, str]] = []
    spot_seen = False
    for fam, s in summaries.items():
        if exposure_of.get(fam) != "unseen":
            continue
        if _is_spot(s):
            if "model_misses" not in s:
                continue
            spot_seen = True
            m, b = int(s["model_misses"]), int(s["best_misses"])
            ok = m <= b
            out.append((ok, f"family {fam}: candidate {m} deadline misses {'<=' if ok else 'NOT <='} {b} of the "
                            f"best baseline ({s['best']}) over {s['windows']} windows; lost GPU-h "
                            f"{s['model_lost_gpu_h']:.1f} vs {s['best_lost_gpu_h']:.1f}; cost "
                            f"{s['model_cost_vs_cheapest']:.3f}x the cheapest baseline ({s['cheapest']})"))
            continue
        if "model_vs_best" not in s:
            continue
        ratio = float(s["model_vs_best"])
        ok = ratio <= 1.0 + tolerance
        out.append((ok, f"family {fam}: candidate {ratio:.3f}x the best heuristic ({s['best']}) over "
                        f"{s['windows']} windows {'<=' if ok else 'NOT <='} {1.0 + tolerance:.2f}x"))
    if not out:
        out.append((False, "no unseen workload family was evaluated: nothing shows the candidate generalises"))
    elif spot_model and not spot_seen:
        out.append((False, "no unseen spot family was evaluated: a spot model is judged on deadline misses "
                           "(`--families spot`)"))
    return out


def verdict(summaries: dict[str, dict[str, Any]], exposure_of: dict[str, str]) -> list[str]:
    """Issue 16's targets on the unseen families, one line each (on-prem, then spot)."""
    unseen = [f for f, s in summaries.items()
              if exposure_of.get(f) == "unseen" and not _is_spot(s) and "model_vs_best" in s]
    spot = [f for f, s in summaries.items() if exposure_of.get(f) == "unseen" and _is_spot(s) and "model_misses" in s]
    if not unseen and not spot:
        return ["no unseen family with a model result: no verdict"]
    lines: list[str] = []
    if unseen:
        worse = [f for f in unseen if summaries[f]["model_vs_best"] > 1.0]
        good = [f for f in unseen if summaries[f]["model_vs_best"] <= 0.95]
        # where even a perfect pick of one heuristic per window, or SJF told the true durations, stays
        # above 0.95x the best heuristic, the 0.95x target asks for more than the family offers
        room = [f for f in unseen if min(summaries[f].get("hindsight_vs_best", 1.0),
                                         summaries[f].get("bound_vs_best") or 1.0) <= 0.95]
        roomy = [f for f in unseen if (summaries[f].get("bound_vs_wp") or 1.0) <= 0.80]
        miss = [f for f in roomy if summaries[f]["model_vs_wp"] > 0.90]
        # worse beyond the windows' luck: the bootstrap interval lies wholly above 1.00x
        clear = [f for f in worse if (summaries[f].get("model_vs_best_lo") or 0.0) > 1.0]
        lines += [
            f"model <= 1.00x best heuristic on every unseen family: {'PASS' if not worse else 'FAIL'}"
            + (f" (worse on {', '.join(worse)}; 95% interval wholly above 1.00x on "
               f"{', '.join(clear) if clear else 'none of them'})" if worse else ""),
            f"model <= 0.95x best heuristic on at least half ({len(good)} of {len(unseen)}): "
            f"{'PASS' if 2 * len(good) >= len(unseen) else 'FAIL'}"
            + f"; headroom to 0.95x (hindsight pick or bound <= 0.95x the best) on {len(room)} of {len(unseen)}"
            + (f" ({', '.join(room)})" if room else ""),
            f"model <= 0.90x weighted-priority where the bound is <= 0.80x ({len(roomy)} families): "
            f"{'PASS' if not miss else 'FAIL'}" + (f" (not on {', '.join(miss)})" if miss else ""),
        ]
    if spot:
        def failing(ok: Callable[[dict[str, Any]], bool]) -> list[str]:
            return [f for f in spot if not ok(summaries[f])]

        for what, bad in (
            ("no more deadline misses than the best baseline",
             failing(lambda s: s["model_misses"] <= s["best_misses"])),
            ("no more lost GPU-hours than the best baseline",
             failing(lambda s: s["model_lost_gpu_h"] <= s["best_lost_gpu_h"] + 1e-9)),
            ("cost <= the cheapest baseline's",
             failing(lambda s: s["model_cost_vs_od"] <= s["cheapest_cost_vs_od"] + 1e-9)),
        ):
            lines.append(f"spot: {what} on every unseen spot family ({len(spot)}): "
                         f"{'PASS' if not bad else 'FAIL'}" + (f" (not on {', '.join(bad)})" if bad else ""))
        # the cost target's headroom: where a perfect per-window pick among the baselines (with no more
        # misses than the best) is no cheaper than the cheapest baseline, only beating every baseline meets it
        known = [f for f in spot if summaries[f].get("hindsight_cost_vs_cheapest") is not None]
        if known:
            room = [f for f in known if summaries[f]["hindsight_cost_vs_cheapest"] < 1.0 - 1e-9]
            lines.append(
                f"spot headroom: a per-window hindsight pick among the baselines (no more misses than the best) "
                f"is cheaper than the cheapest baseline on {len(room)} of {len(known)}"
                + (" (" + ", ".join(f"{f} {summaries[f]['hindsight_cost_vs_cheapest']:.3f}x" for f in room) + ")"
                   if room else ""))
    return lines


def family_table(report: FamilyReport, order: Sequence[str] | None = None) -> str:
    """The per-family markdown table of the on-prem families (benchmark output and model cards)."""
    order = [k for k in (order or list(report.exposure)) if not report.is_spot(k)]
    has_model = any("model_vs_best" in s for s in report.summaries.values())
    head = "| family | seen | windows | best heuristic | best vs WP | bound vs WP | hindsight / bound vs best |"
    rule = "|---|---|---:|---|---:|---:|---:|"
    if has_model:
        head += " model vs best (range) | 95% interval | no worse | model vs WP |"
        rule += "---:|---:|---:|---:|"
    lines = [head, rule]
    for k in order:
        s = report.summaries.get(k)
        if not s or not s.get("windows"):
            why = report.skipped.get(k, "no windows")
            lines.append(f"| {k} | {report.exposure.get(k, '?')} | 0 | {why} | - | - | - |"
                         + (" - | - | - | - |" if has_model else ""))
            continue
        b, bb, hb = s["bound_vs_wp"], s.get("bound_vs_best"), s.get("hindsight_vs_best")
        row = (f"| {k} | {report.exposure[k]} | {s['windows']} | {s['best']} | {s['best_vs_wp']:.3f} | "
               f"{'-' if b is None else f'{b:.3f}'} | {'-' if hb is None else f'{hb:.3f}'} / "
               f"{'-' if bb is None else f'{bb:.3f}'} |")
        if "model_vs_best" in s:
            row += (f" {s['model_vs_best']:.3f} ({s['model_vs_best_min']:.2f}-{s['model_vs_best_max']:.2f}) | "
                    f"{_interval(s)} | {s['model_no_worse']}/{s['windows']} | {s['model_vs_wp']:.3f} |")
        elif has_model:
            row += " - | - | - | - |"
        lines.append(row)
    return "\n".join(lines)


def _interval(summary: dict[str, Any], key: str = "model_vs_best") -> str:
    """``lo-hi`` of a bootstrap interval stored as ``KEY_lo`` / ``KEY_hi`` (``-`` in a summary written before
    it existed)."""
    lo, hi = summary.get(f"{key}_lo"), summary.get(f"{key}_hi")
    if lo is None or hi is None or lo != lo:
        return "-"
    return f"{lo:.3f}-{hi:.3f}"


#: prefix of a choice count that is not a choice: the network preferred that candidate, and the selector's
#: safe default scheduled instead (it travels with the choices through every replay path)
OVERRULED = "overruled:"


def choice_lines(report: FamilyReport, order: Sequence[str] | None = None) -> list[str]:
    """One line per family saying what a selector candidate chose there (share of its choices), most first.

    A selector's mean JCT equal to one heuristic's says little on its own; its choices say whether it
    trusted that heuristic throughout or switched and came out even - and, for a selector with a safe
    default, how many of them the network would have made otherwise (and which it preferred).
    """
    lines = []
    for fam in order or list(report.exposure):
        counts = report.choices.get(fam) or {}
        chosen = {h: c for h, c in counts.items() if not h.startswith(OVERRULED)}
        if not chosen:
            continue
        total = sum(chosen.values())
        parts = [f"{h} {c / total:.0%}" if c / total >= 0.005 else f"{h} <1%"
                 for h, c in sorted(chosen.items(), key=lambda kv: (-kv[1], kv[0]))]
        line = f"{fam}: {', '.join(parts)} of {total:,} choices"
        over = {h.removeprefix(OVERRULED): c for h, c in counts.items() if h.startswith(OVERRULED)}
        if over:
            line += (f"; {sum(over.values()):,} of them unsure, given to the default (the network preferred "
                     + ", ".join(f"{h} {c:,}" for h, c in sorted(over.items(), key=lambda kv: (-kv[1], kv[0])))
                     + ")")
        lines.append(line)
    return lines


#: Caption of :func:`spot_table` (what "best" means there).
SPOT_CAPTION = ("Cost is relative to ondemand-autoscale (on-demand only), a mean of per-window ratios; misses and "
                "lost GPU-hours are totals over the windows. Best baseline = the cheapest among the baselines with "
                "the fewest deadline misses (NAME+rules: behind the candidate's rules; teacher:NAME: the heuristic the "
                "candidate was cloned from or anchored to, and every other spot teacher); cheapest = the cheapest "
                "baseline regardless of misses. Hindsight = each window's cheapest baseline among those missing no "
                "more deadlines there than the best, picked after the fact, against the best and against the "
                "cheapest baseline (means of per-window ratios): where it is not below 1.000 against the cheapest, no "
                "per-window choice of such a baseline is as cheap as the cheapest one, and only a policy that beats "
                "the baselines meets both spot targets. The 95% interval is a bootstrap over the windows of the "
                "model's mean cost ratio to the best baseline, picked again in every resample. Gate: the candidate "
                "fails a family with more misses than the best baseline.")


def spot_table(report: FamilyReport, order: Sequence[str] | None = None) -> str:
    """The per-family markdown table of the spot families (see :data:`SPOT_CAPTION`)."""
    keys = [k for k in (order or list(report.exposure)) if report.is_spot(k)]
    has_model = any("model_misses" in report.summaries.get(k, {}) for k in keys)
    head = ("| family | seen | windows | best baseline | best cost vs OD | best misses | best lost GPU-h "
            "| cheapest baseline (cost vs OD) | hindsight vs best / cheapest |")
    rule = "|---|---|---:|---|---:|---:|---:|---|---:|"
    if has_model:
        head += (" model cost vs OD | model cost vs best (range) | 95% interval | model misses | model lost GPU-h "
                 "| gate |")
        rule += "---:|---:|---:|---:|---:|---|"
    lines = [head, rule]
    for k in keys:
        s = report.summaries.get(k)
        if not s or not s.get("windows"):
            why = report.skipped.get(k, "no windows")
            lines.append(f"| {k} | {report.exposure.get(k, '?')} | 0 | {why} | - | - | - | - | - |"
                         + (" - | - | - | - | - | - |" if has_model else ""))
            continue
        hb, hc = s.get("hindsight_cost_vs_best"), s.get("hindsight_cost_vs_cheapest")
        row = (f"| {k} | {report.exposure[k]} | {s['windows']} | {s['best']} | {s['best_cost_vs_od']:.3f} | "
               f"{s['best_misses']} | {s['best_lost_gpu_h']:.1f} | {s['cheapest']} ({s['cheapest_cost_vs_od']:.3f}) | "
               f"{'-' if hb is None else f'{hb:.3f}'} / {'-' if hc is None else f'{hc:.3f}'} |")
        if "model_misses" in s:
            gate = "pass" if s["model_misses"] <= s["best_misses"] else "FAIL"
            if report.exposure[k] != "unseen":
                gate += f" ({report.exposure[k]}: not counted)"
            row += (f" {s['model_cost_vs_od']:.3f} | {s['model_cost_vs_best']:.3f} "
                    f"({s['model_cost_vs_best_min']:.2f}-{s['model_cost_vs_best_max']:.2f}) | "
                    f"{_interval(s, 'model_cost_vs_best')} | {s['model_misses']} | "
                    f"{s['model_lost_gpu_h']:.1f} | {gate} |")
        elif has_model:
            row += " - | - | - | - | - | - |"
        lines.append(row)
    return "\n".join(lines)


def gate_rules(kinds: Sequence[str]) -> str:
    """The promotion gate's rules, in words, for families of these kinds (``"spot"`` or an on-prem kind)."""
    rules = ["<= 1.02x the best heuristic on every unseen family"] if any(k != "spot" for k in kinds) else []
    if "spot" in kinds:
        rules.append("no more deadline misses than the best baseline on every unseen spot family")
    return "; ".join(rules)


def family_tables(report: FamilyReport, order: Sequence[str] | None = None) -> str:
    """The on-prem table (when an on-prem family was judged, or nothing was) and the spot table with its caption.

    What the benchmark, the training run's card and ``rlsched models gate`` print, so a spot-only
    judgement never shows an empty on-prem table and always explains its own.
    """
    keys = list(order or report.exposure)
    spot = any(report.is_spot(k) for k in keys)
    parts = [family_table(report, order)] if not spot or any(not report.is_spot(k) for k in keys) else []
    if spot:
        parts += [spot_table(report, order), SPOT_CAPTION]
    return "\n\n".join(parts)


def spot_window_table(report: FamilyReport) -> str:
    """Every spot window: each competitor's cost vs on-demand-only / deadline misses."""
    names = list(dict.fromkeys(n for rows in report.spot_windows.values() for row in rows.values() for n in row))
    shown = [n for n in names if n != ONDEMAND_REFERENCE]
    lines = [f"| family | window | {ONDEMAND_REFERENCE} misses | " + " | ".join(shown) + " |",
             "|---|---|---:|" + "---:|" * len(shown)]
    for fam, rows in report.spot_windows.items():
        for label, row in rows.items():
            ref = row[ONDEMAND_REFERENCE]
            cost = ref["cost_usd"] or float("nan")
            lines.append(f"| {fam} | {label.split('/', 1)[-1]} | {ref['deadline_misses']:.0f} | "
                         + " | ".join(f"{row[n]['cost_usd'] / cost:.3f} / {row[n]['deadline_misses']:.0f}"
                                      for n in shown) + " |")
    return "\n".join(lines)


def window_table(report: FamilyReport) -> str:
    """Every window's mean JCT relative to weighted-priority, one row per window."""
    names = list(dict.fromkeys(n for rows in report.windows.values() for row in rows.values() for n in row))
    shown = [n for n in names if n != "weighted-priority"]
    lines = ["| family | window | " + " | ".join(shown) + " |", "|---|---|" + "---:|" * len(shown)]
    for fam, rows in report.windows.items():
        for label, row in rows.items():
            wp = row.get("weighted-priority") or float("nan")
            lines.append(f"| {fam} | {label.split('/', 1)[-1]} | "
                         + " | ".join(f"{row[n] / wp:.3f}" for n in shown) + " |")
    return "\n".join(lines)


def print_progress(done: int, total: int, elapsed: float) -> None:
    """A one-line progress report on stderr (every replay on a terminal, every 50th otherwise)."""
    if sys.stderr.isatty() or done == total or done % 50 == 0:
        eta = elapsed / done * (total - done)
        end = "\n" if done == total else ""
        print(f"\r  {done}/{total} replays, {elapsed:.0f} s elapsed, ~{eta:.0f} s left", end=end,
              file=sys.stderr, flush=True)
