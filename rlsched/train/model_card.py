"""The model card of a trained policy: ``card.json`` (what was trained on what, and how it did) and MODEL_CARD.md.

:func:`build_card` assembles the card from the experiment and what training measured
(:class:`CardFacts`); :func:`forecast_card` is its demand-forecast section;
:func:`model_card_markdown` renders the human card next to it. The card is what
``rlsched models``, the promotion gate and a later reader of the model folder rely on to
know how the policy was produced, so every field comes from the run, never from defaults.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsched.envs.trained_actions import TrainedActions
from rlsched.train.config import RULE_PARAMS, Experiment
from rlsched.train.evaluate import ORACLE_BOUND, is_reference, ratio_text
from rlsched.train.families import trained_generator_families, trained_market_families
from rlsched.train.forecast_fit import FORECASTER_FILE

#: how the card names each rule and says where it acts
_RULE_LINES = (
    ("deadline_guard", "deadline guard", "runs before the network at every decision point, in training and serving"),
    ("consolidate", "node consolidation", "runs after the guard, before the network"),
    ("preempt_long", "long-job preemption", "runs after the other rules, before the network"),
)


def _served_only(card: dict[str, Any], rule: str) -> str:
    """What of ``rule``'s parameters (shown as served) the network did *not* train behind: ``; trained with
    KEY=V, served with KEY=W`` per key ``serve_rules`` changes (empty when serving changes none of them)."""
    changed = (card.get("serve_rules") or {}).get(rule) or {}
    trained = (card.get("trained_rules") or {}).get(rule) or {}
    return "".join(f"; trained with {k}={trained.get(k)!r}, served with {k}={v!r}" for k, v in changed.items())


def git_commit() -> str:
    """The commit of the checkout this package runs from, or ``unknown`` outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(frozen=True)
class CardFacts:
    """What a training run measured, for its card.

    Attributes:
        observation_signature: the codec's signature the network reads.
        training_worlds: labels of every training world (generated ones included).
        steps: PPO steps taken.
        wall_s: training wall time in seconds (up to the final evaluation).
        bc_stats: behaviour-cloning statistics, empty when there was no cloning in this run.
        ev: the final evaluation on the evaluation windows (``evaluate``'s result).
        ho: the same on the holdout windows, or None without holdout.
        trained_actions: the action kinds the training worlds offered.
        forecast: the card's ``forecast`` section (:func:`forecast_card`), or None without a forecaster.
        resumed_from: the checkpoint a ``--resume`` run started from (None: trained from scratch). Its wall
            time is then this run's only, so the card says so.
    """

    observation_signature: str
    training_worlds: list[str]
    steps: int
    wall_s: float
    bc_stats: dict[str, float]
    ev: dict[str, Any]
    ho: dict[str, Any] | None
    trained_actions: TrainedActions
    forecast: dict[str, Any] | None
    resumed_from: str | None = None


def build_card(exp: Experiment, facts: CardFacts) -> dict[str, Any]:
    """The card (``card.json``) of a policy trained by ``exp``."""
    gen, gm = exp.generated, exp.generated_markets
    ev, ho = facts.ev, facts.ho
    return {
        "name": exp.name,
        "description": exp.description,
        "observation_signature": facts.observation_signature,
        "experiment": exp.source,
        "scenarios": [{"name": e.name, "scenario": e.scenario, "train_window_h": e.train_window_h,
                       "eval_windows_h": e.eval_windows_h, "clusters": e.clusters,
                       "load_factors": e.load_factors} for e in exp.scenarios],
        "holdout": [{"name": e.name, "scenario": e.scenario, "eval_windows_h": e.eval_windows_h,
                     "clusters": e.clusters, "load_factors": e.load_factors} for e in exp.holdout],
        "training_worlds": list(facts.training_worlds),
        "families": trained_generator_families(gen.exclude, gen.max_nodes, gen.families) if gen else [],
        "generated": {"count": gen.count, "jobs": gen.jobs, "seed": gen.seed, "exclude": list(gen.exclude),
                      "max_nodes": gen.max_nodes, "families": list(gen.families), "family_count": gen.family_count}
        if gen else None,
        # the market kinds domain randomisation covered: spot families on them count as trained
        "market_families": trained_market_families(gm.exclude) if gm else [],
        "generated_markets": {"count": gm.count, "seed": gm.seed, "exclude": list(gm.exclude)} if gm else None,
        "steps": facts.steps,
        "seed": exp.seed,
        "wall_s": round(facts.wall_s, 1),
        "behaviour_cloning": {"teacher": exp.bc.teacher, **facts.bc_stats} if facts.bc_stats else None,
        "anchor": exp.anchor,
        "git_commit": git_commit(),
        "metrics": {"eval": ev["summary"], "eval_relative": ev["relative"],
                    "holdout": ho["summary"] if ho else None,
                    "holdout_relative": ho["relative"] if ho else None},
        "per_window": {"eval": ev["worlds"], "holdout": ho["worlds"] if ho else None},
        "command": f"rlsched train {exp.source}" + (" --resume" if facts.resumed_from else ""),
        "resumed_from": facts.resumed_from,
        "trained_actions": facts.trained_actions.to_dict(),
        "forecast": facts.forecast,
        **{name: exp.rule_params().get(name) for name in RULE_PARAMS},
        # serving-only rule changes, and the rules as trained (a retrain trains behind these, not the served)
        "serve_rules": exp.serve_rules or None,
        "trained_rules": exp.trained_rule_params() if exp.serve_rules else None,
    }


def forecast_card(exp: Experiment, fitted: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The card's ``forecast`` section: the forecaster saved with the model, where each was fitted, and
    its error on the evaluation windows against the baseline (``report`` from ``forecast_error``)."""
    first = exp.scenarios[0]
    return {
        "model": exp.forecast.model, "horizon_s": exp.forecast.horizon_s, "file": FORECASTER_FILE,
        "params": exp.forecast.model_params(), "saved": first.name,
        "fitted_on": {name: {"train_window_h": next(e.train_window_h for e in exp.scenarios if e.name == name),
                             "fit_range_s": getattr(f, "fit_range", None)} for name, f in fitted.items()},
        "error": {"baseline": report["baseline"], "step_s": report["step_s"],
                  "origins": report["origins"], "mean": report["mean"],
                  "windows": {k: ({"origins": v["origins"], "mean_actual": v["mean_actual"],
                                   "model": v["forecaster"], "baseline": v["baseline"]}
                                  if v.get("origins") else {"origins": 0})
                              for k, v in report["windows"].items()}},
    }


def spot_summary(card: dict[str, Any]) -> list[str]:
    """Card lines on spot economics, when the evaluation has the on-demand-only reference.

    Cost and JCT against on-demand-only capacity, deadline misses against Uniform
    Progress (issue 6's yardstick), and every policy that is both cheaper and misses
    no more deadlines - where a baseline wins, the card says so.
    """
    rel, ev = card["metrics"]["eval_relative"], card["metrics"]["eval"]
    mine = rel.get("ppo", {})
    if "cost_vs_ondemand" not in mine:
        return []
    misses = ev["ppo"]["deadline_misses"]
    up = ev.get("uniform-progress", {}).get("deadline_misses")
    better = sorted(p for p, r in rel.items() if p != "ppo" and not is_reference(p)
                    and r.get("cost_vs_ondemand", float("inf")) < mine["cost_vs_ondemand"]
                    and ev[p]["deadline_misses"] <= misses)
    return [
        f"Against on-demand-only capacity (`ondemand-autoscale`), mean over the evaluation windows: cost "
        f"{mine['cost_vs_ondemand']:.3f}x, mean JCT {mine['jct_vs_ondemand']:.3f}x, {misses:.1f} deadline misses "
        f"per window" + (f" (uniform-progress: {up:.1f})." if up is not None else "."),
        "",
        "Cheaper than it with no more deadline misses: " + (", ".join(better) if better else "none") + ".",
        "",
    ]


#: the card's trained-actions line: a per-slot model is served behind that record; a selector never acts
#: itself (its heuristics do, on any fleet), so for it the line only says what its training fleets offered
_ACTIONS_LINE = {
    "slots": "trained actions (`actions.json`; the rest is masked and left to weighted-priority when served)",
    "selector": "training fleets offered (a selector acts only through its heuristics: nothing is masked)",
}


def model_card_markdown(card: dict[str, Any], table: str) -> str:
    """The human model card (MODEL_CARD.md) next to card.json."""
    rel = card["metrics"]["eval_relative"].get("ppo", {})
    wins = []
    for p, s in card["metrics"]["eval"].items():
        if p != "ppo" and not is_reference(p) and s["mean_jct_s"] < card["metrics"]["eval"]["ppo"]["mean_jct_s"]:
            wins.append(p)
    bound = card["metrics"]["eval_relative"].get(ORACLE_BOUND, {}).get("jct_vs_weighted_priority")
    # a spot model is bought to save money within deadlines: its card leads with that, then its JCT
    spot = spot_summary(card)
    lines = [
        f"# Model card: {card['name']}",
        "",
        card.get("description") or "",
        "",
        f"- observation signature: `{card['observation_signature']}`",
        f"- produced by: `{card['command']}` (git {card['git_commit'][:12]})",
        f"- steps: {card['steps']:,}, seed {card['seed']}, training wall time {card['wall_s']:.0f} s"
        + _reused_labels(card)
        + (f" (this run's only: it resumed from `{card['resumed_from']}`)" if card.get("resumed_from") else ""),
        f"- training worlds: {len(card['training_worlds'])} ({', '.join(card['training_worlds'][:6])}"
        f"{', ...' if len(card['training_worlds']) > 6 else ''})",
        f"- behaviour cloning: {card['behaviour_cloning'] or 'off'}",
        *([f"- anchored to: `{card['anchor']}` (the network adds a fixed weight times that teacher's legal choice to "
           "its logits: it starts as the teacher and departs where its own scores outweigh it)"]
          if card.get("anchor") else []),
        *_unsure_line(card),
        *([f"- {_ACTIONS_LINE['selector' if card.get('selector') else 'slots']}: "
           f"{TrainedActions.from_dict(card['trained_actions']).describe()}"] if card.get("trained_actions") else []),
        *(f"- {title}: {card[name]} ({where}; `{name}.json`){_served_only(card, name)}"
          for name, title, where in _RULE_LINES if card.get(name)),
        *([f"- served, not trained, with: {card['serve_rules']} (the network trained behind the rules without these "
           "changes; the evaluation and gate tables are served with them)"] if card.get("serve_rules") else []),
        "",
        *spot,
        f"On the evaluation windows the policy's mean JCT is {ratio_text(rel.get('jct_vs_weighted_priority'))}x "
        + (f"weighted-priority's at {ratio_text(rel.get('cost_vs_weighted_priority'))}x its cost."
           if ratio_text(rel.get("cost_vs_weighted_priority")) != "-"
           else "weighted-priority's (which paid nothing for capacity there, so there is no cost ratio)."),
        "",
        "Heuristics that still beat it on mean JCT: " + (", ".join(sorted(wins)) if wins else "none") + ".",
        "",
        *([f"Headroom: `{ORACLE_BOUND}` (SJF told every job's true duration - information no scheduler has) "
           f"reaches {bound:.3f}x weighted-priority's mean JCT on these windows; it bounds what job ordering "
           "alone can gain here and is a reference row, not a competitor.", ""] if bound is not None else []),
        table,
    ]
    return "\n".join(lines) + "\n"


def _unsure_line(card: dict[str, Any]) -> list[str]:
    """A selector's safe default for unsure choices, when it has one (the card line, or none)."""
    sel = card.get("selector") or {}
    if not sel.get("default"):
        return []
    return [f"- unsure choices go to {sel['default']}, the labels' safest candidate: another is chosen only with "
            f"{sel['margin']:g} more probability (`selector.json`)"]


def _reused_labels(card: dict[str, Any]) -> str:
    """How much of a selector's wall time was labelling reused from an earlier run ("" when none was)."""
    bc = card.get("behaviour_cloning") or {}
    if not bc.get("selector/labels_reused"):
        return ""
    return (f" (including {float(bc.get('selector/label_wall_s', 0.0)):.0f} s of labelling, reused from an earlier "
            f"run's `selector_labels.npz`)")
