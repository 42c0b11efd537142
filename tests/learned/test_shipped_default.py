"""The shipped ``models/default``: a heuristic selector, loadable by every path a model takes, that
finishes the fleets the per-slot model once livelocked on (every decision it yields is a candidate
heuristic's own, so it has no loop of its own to fall into; ``test_selector.py`` checks that).

How well it schedules is the benchmark's business (``benchmarks/generalisation.py``, BENCHMARKS.md);
these tests pin what the folder is and that serving it is safe.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.envs.regime import REGIME_FEATURES
from rlsched.learned.ppo import load_policy_ref
from rlsched.learned.selector import SelectorModel, is_selector_folder
from rlsched.policies import make_policy
from rlsched.scenario import load_scenario
from rlsched.sim import Engine
from rlsched.train.config import load_experiment

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "models" / "default"


def test_the_default_is_the_selector_its_experiment_writes() -> None:
    assert is_selector_folder(DEFAULT)
    model = load_policy_ref(str(DEFAULT))
    assert isinstance(model, SelectorModel)
    assert model.features == REGIME_FEATURES  # it reads what this rlsched computes
    for name in model.candidates:
        make_policy(name)
    assert model.card["command"] == "rlsched train experiments/selector.yaml"
    exp = load_experiment(ROOT / "experiments" / "selector.yaml")
    assert exp.output is not None and Path(exp.output).resolve() == DEFAULT.resolve()
    # the per-slot scorer it replaced is kept, and written by its own experiment
    scorer = load_experiment(ROOT / "experiments" / "default.yaml")
    assert scorer.output is not None and Path(scorer.output).resolve() == (ROOT / "models" / "scorer").resolve()


@pytest.mark.parametrize("scenario", [None, str(ROOT / "envs" / "hybrid-openb-mig.yaml")],
                         ids=["bundled-default", "hybrid-openb-mig"])
def test_the_default_finishes_elastic_and_mig_fleets_without_a_loop(scenario: str | None) -> None:
    model = SelectorModel.load(DEFAULT)
    sc = load_scenario(scenario)
    jobs = sorted(sc.jobs, key=lambda j: j.submit_time)[:300]
    sched = model.scheduler()
    report = Engine(sc.pools, jobs, sc.market, sc.sim).run(sched)
    assert report.jobs_completed + report.jobs_unschedulable + report.jobs_skipped == len(jobs)
    assert report.loop_handovers == 0 and report.refused_decisions == 0
    reasons = report.unschedulable_reasons
    assert not any(k.startswith(("never placed", "unfinished")) for k in reasons), reasons
    assert sum(sched.choices.values()) > 0 and set(sched.choices) <= set(model.candidates)
    # the per-slot model's livelock left jobs never placed here; the selector completes as many as its fallback
    alone = Engine(sc.pools, jobs, sc.market, sc.sim).run(make_policy("weighted-priority"))
    assert report.jobs_completed == alone.jobs_completed


def test_the_default_sends_unsure_choices_to_sjf_and_keeps_a_tenantless_trace_at_sjfs_jct() -> None:
    """The window where the plain argmax lost 8.9x to SJF (BENCHMARKS.md, "A safe default for unsure choices"):
    Philly hours 446-494 without tenants on 12 x 8 A100 at load 0.9, a training-side window."""
    from dataclasses import replace

    from rlsched.train.evaluate import run_world
    from rlsched.train.families import _PHILLY, TraceFamily

    model = load_policy_ref(str(DEFAULT))
    assert isinstance(model, SelectorModel) and model.default == "sjf" and model.margin == pytest.approx(0.1)
    exp = load_experiment(ROOT / "experiments" / "selector.yaml")
    assert exp.selector is not None and exp.selector.margin == model.margin and exp.selector.default == "auto"
    fam = TraceFamily("anon", "", _PHILLY, "12x8xA100-80GB", 0.9, 48.0, 50.0, 1800.0, anonymous=True)
    if not fam.available():
        pytest.skip("the Philly trace is not in the shared data")
    world = next(w for w in fam.windows(5, 1500) if w.label.endswith("/446-494h"))
    sjf = run_world(world, make_policy("sjf")).mean_jct_s
    assert run_world(world, model.scheduler()).mean_jct_s <= 1.02 * sjf
    plain = replace(model, default=None, margin=0.0)  # what it did before: the argmax between near-equal odds
    assert run_world(world, plain.scheduler()).mean_jct_s > 2 * sjf
