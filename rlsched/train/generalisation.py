"""Judge a policy per workload family against the best heuristic: the benchmark and the promotion gate.

One evaluation serves three readers: ``benchmarks/generalisation.py`` prints it,
a training run stores it in the model card, and ``rlsched promote`` refuses a
candidate that it condemns. Per family (:mod:`rlsched.train.families`) every window is
replayed under the candidate, every on-prem heuristic and SJF told the true durations
(a bound, never a competitor). The **best heuristic** of a family is the one with the
lowest mean over windows of its ratio to weighted-priority's mean JCT; the candidate
is judged by the mean over windows of ``candidate / best`` (a mean of ratios, so a
short window counts as much as a long one).

A candidate served behind rules (deadline guard, consolidation, long-job preemption)
is compared with every heuristic both bare and behind the *same* rules (``NAME+rules``),
and the best of all of them is the bar, so a gain is the network's and not the rules'.

The gate (:func:`family_checks`) refuses a candidate more than
:data:`GATE_TOLERANCE` (2%) worse than the best heuristic on any family it has not
seen; families it trained or was tuned on are reported but never count.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
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

_WORLDS: list[Any] = []
_MODEL_REF: str | None = None
_MODEL: Any = None


@dataclass
class FamilyReport:
    """What one evaluation over families found.

    Attributes:
        summaries: ``{family: summary}`` (see :func:`summarise`).
        exposure: ``{family: "trained" | "tuned" | "unseen"}``.
        windows: ``{family: {window label: {competitor: mean JCT s}}}``.
        skipped: ``{family: why it has no window}``.
        wall_s: seconds the replays took.
    """

    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    exposure: dict[str, str] = field(default_factory=dict)
    windows: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summaries, "exposure": self.exposure, "windows": self.windows,
                "skipped": self.skipped, "wall_s": self.wall_s}


def _init(worlds: list[Any], model_ref: str | None) -> None:
    global _WORLDS, _MODEL_REF, _MODEL
    if model_ref != _MODEL_REF:
        _MODEL = None  # a model already loaded for this ref (to read its rules) is kept
    _WORLDS, _MODEL_REF = worlds, model_ref


def _model() -> Any:
    """The candidate, loaded once per process (a replay must not pay torch's load time)."""
    global _MODEL
    if _MODEL is None:
        from rlsched.policies.ppo import load_policy_ref

        assert _MODEL_REF is not None
        _MODEL = load_policy_ref(_MODEL_REF)
    return _MODEL


def _run(task: tuple[int, str]) -> tuple[int, str, float]:
    """Replay world ``i`` under one competitor; its mean JCT (runs in worker processes too)."""
    from rlsched.policies import make_policy
    from rlsched.train.evaluate import run_world

    i, name = task
    world = _WORLDS[i]
    if name == CANDIDATE:
        from rlsched.policies.ppo import PpoScheduler

        rep = run_world(world, PpoScheduler(_model(), name=CANDIDATE))
    elif name == BOUND:
        rep = run_world(world, make_policy("sjf"), oracle_durations=True)
    elif name.endswith(RULED):
        from rlsched.policies.rules import RuledScheduler

        rep = run_world(world, RuledScheduler(make_policy(name[: -len(RULED)]), _model().new_rules()))
    else:
        rep = run_world(world, make_policy(name))
    return i, name, float(rep.result()["mean_jct_s"])


def evaluate_families(
    fams: Sequence[Family],
    model_ref: str | None,
    *,
    card: dict[str, Any] | None = None,
    windows: int = 6,
    max_jobs: int = 2000,
    processes: int = 1,
    progress: Callable[[int, int, float], None] | None = None,
) -> FamilyReport:
    """Replay every family's windows under the candidate (``model_ref``; None: heuristics only).

    ``card`` is the candidate's model card: windows of traces it saw are not cut and
    its exposure to each family is recorded. Families whose data is missing are
    ``skipped`` with the reason, never an error.
    """
    report = FamilyReport()
    worlds: list[Any] = []
    fam_of: list[str] = []
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
    names = [*HEURISTICS, BOUND]
    if model_ref:
        _init([], model_ref)
        if _model().new_rules():
            names += [h + RULED for h in HEURISTICS]
        names.append(CANDIDATE)
    tasks = [(i, n) for i in range(len(worlds)) for n in names]
    results: dict[int, dict[str, float]] = {}
    t0 = time.perf_counter()
    if processes > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(processes, initializer=_init, initargs=(worlds, model_ref)) as pool:
            for done, (i, n, r) in enumerate(pool.map(_run, tasks, chunksize=1), 1):
                results.setdefault(i, {})[n] = r
                if progress is not None:
                    progress(done, len(tasks), time.perf_counter() - t0)
    else:
        _init(worlds, model_ref)
        for done, task in enumerate(tasks, 1):
            i, n, r = _run(task)
            results.setdefault(i, {})[n] = r
            if progress is not None:
                progress(done, len(tasks), time.perf_counter() - t0)
    report.wall_s = time.perf_counter() - t0
    for i, w in enumerate(worlds):
        report.windows.setdefault(fam_of[i], {})[w.label] = results[i]
    report.summaries = {f: summarise(rows) for f, rows in report.windows.items()}
    return report


def summarise(per_window: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A family's summary from ``{window: {competitor: mean JCT}}`` (see the module docstring).

    Keys: ``windows``, ``best`` (heuristic), ``best_vs_wp``, ``heuristics_vs_wp``,
    ``bound_vs_wp`` (every competitor but the bound and the candidate is a heuristic,
    ``NAME+rules`` ones included) and, with a candidate, ``model_vs_best`` (mean of per-window
    ratios) with its ``_min`` / ``_max``, ``model_no_worse`` (windows) and ``model_vs_wp``.
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
    }
    if CANDIDATE in first:
        r = vs(CANDIDATE, best)
        out.update({
            "model_vs_best": statistics.fmean(r), "model_vs_best_min": min(r), "model_vs_best_max": max(r),
            "model_no_worse": sum(x <= 1.0 + 1e-9 for x in r),
            "model_vs_wp": statistics.fmean(vs(CANDIDATE, "weighted-priority")),
        })
    return out


def family_checks(summaries: dict[str, dict[str, Any]], exposure_of: dict[str, str],
                  tolerance: float = GATE_TOLERANCE) -> list[tuple[bool, str]]:
    """The promotion gate: ``(ok, text)`` per unseen family with a candidate result.

    No unseen family at all is itself a failed check: a gate that judged nothing
    must not let a candidate through.
    """
    out: list[tuple[bool, str]] = []
    for fam, s in summaries.items():
        if exposure_of.get(fam) != "unseen" or "model_vs_best" not in s:
            continue
        ratio = float(s["model_vs_best"])
        ok = ratio <= 1.0 + tolerance
        out.append((ok, f"family {fam}: candidate {ratio:.3f}x the best heuristic ({s['best']}) over "
                        f"{s['windows']} windows {'<=' if ok else 'NOT <='} {1.0 + tolerance:.2f}x"))
    if not out:
        out.append((False, "no unseen workload family was evaluated: nothing shows the candidate generalises"))
    return out


def verdict(summaries: dict[str, dict[str, Any]], exposure_of: dict[str, str]) -> list[str]:
    """Issue 16's targets on the unseen families, one line each."""
    unseen = [f for f, s in summaries.items() if exposure_of.get(f) == "unseen" and "model_vs_best" in s]
    if not unseen:
        return ["no unseen family with a model result: no verdict"]
    worse = [f for f in unseen if summaries[f]["model_vs_best"] > 1.0]
    good = [f for f in unseen if summaries[f]["model_vs_best"] <= 0.95]
    roomy = [f for f in unseen if (summaries[f].get("bound_vs_wp") or 1.0) <= 0.80]
    miss = [f for f in roomy if summaries[f]["model_vs_wp"] > 0.90]
    return [
        f"model <= 1.00x best heuristic on every unseen family: {'PASS' if not worse else 'FAIL'}"
        + (f" (worse on {', '.join(worse)})" if worse else ""),
        f"model <= 0.95x best heuristic on at least half ({len(good)} of {len(unseen)}): "
        f"{'PASS' if 2 * len(good) >= len(unseen) else 'FAIL'}",
        f"model <= 0.90x weighted-priority where the bound is <= 0.80x ({len(roomy)} families): "
        f"{'PASS' if not miss else 'FAIL'}" + (f" (not on {', '.join(miss)})" if miss else ""),
    ]


def family_table(report: FamilyReport, order: Sequence[str] | None = None) -> str:
    """The per-family markdown table (benchmark output and model cards)."""
    has_model = any("model_vs_best" in s for s in report.summaries.values())
    head = "| family | seen | windows | best heuristic | best vs WP | bound vs WP |"
    rule = "|---|---|---:|---|---:|---:|"
    if has_model:
        head += " model vs best (range) | no worse | model vs WP |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for k in order or list(report.exposure):
        s = report.summaries.get(k)
        if not s or not s.get("windows"):
            why = report.skipped.get(k, "no windows")
            lines.append(f"| {k} | {report.exposure.get(k, '?')} | 0 | {why} | - | - |"
                         + (" - | - | - |" if has_model else ""))
            continue
        b = s["bound_vs_wp"]
        row = (f"| {k} | {report.exposure[k]} | {s['windows']} | {s['best']} | {s['best_vs_wp']:.3f} | "
               f"{'-' if b is None else f'{b:.3f}'} |")
        if "model_vs_best" in s:
            row += (f" {s['model_vs_best']:.3f} ({s['model_vs_best_min']:.2f}-{s['model_vs_best_max']:.2f}) | "
                    f"{s['model_no_worse']}/{s['windows']} | {s['model_vs_wp']:.3f} |")
        elif has_model:
            row += " - | - | - |"
        lines.append(row)
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
