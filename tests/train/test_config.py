"""The experiment schema: strict keys, window rules, clear errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlsched.train.config import ExperimentError, load_experiment

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


BASE = """
name: t
scenarios:
  - name: a
    scenario: bundled:default
    train_window_h: [0, 10]
    eval_windows_h: [[20, 30]]
"""


def test_shipped_experiments_load() -> None:
    for name in ("smoke", "default", "spot", "spot-anchored", "selector", "selector-fold-b", "selector-tiresias",
                 "selector-named", "selector-dagger"):
        exp = load_experiment(ROOT / "experiments" / f"{name}.yaml")
        assert exp.scenarios and exp.total_steps > 0
    # the two folds of the selector recipe leave disjoint generator kinds out, and differ in nothing else
    a, b = (load_experiment(ROOT / "experiments" / f"{n}.yaml") for n in ("selector", "selector-fold-b"))
    assert a.generated is not None and b.generated is not None
    assert not set(a.generated.exclude) & set(b.generated.exclude)
    assert a.selector is not None and a.selector.margin > 0
    assert b.selector == a.selector and a.ppo == b.ppo and a.scenarios == b.scenarios
    # the ablations predate the safe default for unsure choices (their BENCHMARKS.md numbers are the plain
    # argmax's): each is the recipe without it
    a0 = replace(a.selector, margin=0.0)
    # the Tiresias ablation is fold A with one more candidate, and never writes the shipped model
    t = load_experiment(ROOT / "experiments" / "selector-tiresias.yaml")
    assert t.selector is not None
    assert t.selector.candidates == (*a.selector.candidates, "tiresias")
    assert replace(t.selector, candidates=a.selector.candidates) == a0
    assert t.generated == a.generated and t.ppo == a.ppo and t.scenarios == a.scenarios
    assert t.output != a.output and "models" not in Path(t.output).parts
    # the named-families ablation is fold A plus draws of families fold A already counts as trained
    n = load_experiment(ROOT / "experiments" / "selector-named.yaml")
    assert n.generated is not None and n.generated.families and not set(n.generated.families) & set(a.generated.exclude)
    assert replace(n.generated, families=(), family_count=a.generated.family_count) == a.generated
    assert n.selector == a0 and n.ppo == a.ppo and n.scenarios == a.scenarios
    assert n.output != a.output and "models" not in Path(n.output).parts
    assert n.mlflow.registered_model != a.mlflow.registered_model
    # the DAgger ablation is fold A with labelling rounds along the cloned policy's own trajectories
    d = load_experiment(ROOT / "experiments" / "selector-dagger.yaml")
    assert d.selector is not None and d.selector.label_rounds >= 1 and a.selector.label_rounds == 0
    assert replace(d.selector, label_rounds=0) == a0
    assert d.generated == a.generated and d.ppo == a.ppo and d.scenarios == a.scenarios
    assert d.output != a.output and "models" not in Path(d.output).parts


def test_defaults_and_flat_params(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, BASE))
    assert exp.ppo.gamma == pytest.approx(0.999)
    params = exp.flat_params()
    assert params["ppo.learning_rate"] == pytest.approx(3e-4)
    assert params["scenarios.0.name"] == "a"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("totl_steps: 5\n", "did you mean 'total_steps'"),
        ("ppo: {learning_rat: 0.1}\n", "did you mean 'learning_rate'"),
        ("reward: {jtc: 1}\n", "did you mean 'jct'"),
        ("vec_env: threads\n", "subproc or dummy"),
        ("n_envs: 0\n", "n_envs must be >= 1"),
        ("ppo: {n_steps: 8, batch_size: 64}\nn_envs: 2\n", "batch_size"),
        ("forecast: {horzon_s: 60}\n", "did you mean 'horizon_s'"),
        ("forecast: {model: smoothed-seasonl}\n", "forecast.model must be one of"),
        ("forecast: {model: smoothed-seasonal, season_s: 60}\n", "season_s do not apply"),
        ("forecast: {model: seasonal-naive, tau_s: 60}\n", "tau_s do not apply"),
        ("forecast: {horizon_s: 0}\n", "must be > 0"),
        ("forecast: {tau_s: -1}\n", "tau_s must be > 0"),
        ("bc: {teacher: srtf}\n", "bc.teacher must be one of weighted-priority, sjf"),
        ("bc: {techer: sjf}\n", "did you mean 'teacher'"),
        ("deadline_guard: {margin_frac: -0.5}\n", "deadline_guard: margin_frac"),
        ("deadline_guard: {margin_fraction: 0.5}\n", "did you mean 'margin_frac'"),
        ("deadline_guard: 0.25\n", "deadline_guard: expected a mapping"),
        ("deadline_guard: {preempt: sometimes}\n", "backlog_buy, trust_deadline: each must be true or false"),
        ("deadline_guard: {gangs_off_spot: 1}\n", "backlog_buy, trust_deadline: each must be true or false"),
        ("deadline_guard: {backlog_buy: 1}\n", "backlog_buy, trust_deadline: each must be true or false"),
        ("consolidate: {min_hold: 60}\n", "did you mean 'min_hold_s'"),
        ("consolidate: {min_hold_s: -1}\n", "consolidate: min_hold_s"),
        ("consolidate: yes\n", "consolidate: expected a mapping"),
        ("preempt_long: {factr: 5}\n", "did you mean 'factor'"),
        ("preempt_long: {factor: 0.5}\n", "preempt_long: factor must be >= 1"),
        ("mig_resplit: {max_per_pass: 0}\n", "mig_resplit: max_per_pass and scan must be >= 1"),
        ("extra_globals: [estimate_error]\n", "unknown feature 'estimate_error' .did you mean 'estimate_log_error'"),
        ("extra_globals: estimate_log_error\n", "extra_globals must be a list of names"),
        ("anchor: best-follow\n",
         "anchor must be one of weighted-priority, sjf, sjf-spot-first, sjf-spot-reserve .or follow:NAME"),
        ("anchor: follow:sjf\n", "anchor must be one of"),
        ("anchor: [sjf]\n", "anchor must be one of"),
        ("bc: {select_episodes: 0}\n", "bc.select_episodes must be >= 1 and bc.select_jobs >= 0"),
        ("deadline_guard: {}\nserve_rules: {deadline_gaurd: {preempt: true}}\n",
         "serve_rules.deadline_gaurd: unknown rule .did you mean 'deadline_guard'"),
        ("serve_rules: {consolidate: {min_hold_s: 60}}\n",
         "serve_rules.consolidate: the experiment trains behind no consolidate"),
        ("deadline_guard: {}\nserve_rules: {deadline_guard: {trust_deadlines: true}}\n",
         "serve_rules.deadline_guard: .*did you mean 'trust_deadline'"),
        ("deadline_guard: {}\nserve_rules: {deadline_guard: {margin_frac: -1}}\n",
         "serve_rules.deadline_guard: margin_frac, min_margin_s and restart_overhead_s must be >= 0"),
        ("deadline_guard: {}\nserve_rules: {deadline_guard: {}}\n",
         "serve_rules.deadline_guard: expected a mapping of the rule's parameters"),
        ("deadline_guard: {}\nserve_rules: [deadline_guard]\n", "serve_rules: expected a mapping of rule names"),
    ],
)
def test_bad_keys_and_values(tmp_path: Path, extra: str, needle: str) -> None:
    with pytest.raises(ExperimentError, match=needle.replace("(", r"\(")):
        load_experiment(write(tmp_path, BASE + extra))


def test_deadline_guard_is_off_unless_given(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, BASE)).deadline_guard is None
    exp = load_experiment(write(tmp_path, BASE + "deadline_guard: {margin_frac: 0.1}\n"))
    assert exp.deadline_guard is not None
    assert exp.deadline_guard.params() == {"margin_frac": 0.1, "min_margin_s": 300.0, "restart_overhead_s": 60.0,
                                           "spot_last_resort": True, "preempt": False, "gangs_off_spot": False,
                                           "backlog_buy": False, "trust_deadline": False}
    assert exp.flat_params()["deadline_guard.margin_frac"] == pytest.approx(0.1)
    assert exp.rule_params() == {"deadline_guard": exp.deadline_guard.params()}


def test_serve_rules_change_what_is_served_not_what_is_trained(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, BASE + "deadline_guard: {preempt: true}\nconsolidate: {}\n"
                                "serve_rules:\n  deadline_guard: {trust_deadline: true, margin_frac: 0.5}\n"))
    trained, served = exp.trained_rule_params(), exp.rule_params()
    assert trained["deadline_guard"]["trust_deadline"] is False and trained["deadline_guard"]["margin_frac"] == 0.25
    assert served["deadline_guard"] == {**trained["deadline_guard"], "trust_deadline": True, "margin_frac": 0.5}
    assert served["consolidate"] == trained["consolidate"]  # a rule serve_rules does not name is served as trained
    assert exp.flat_params()["serve_rules.deadline_guard.trust_deadline"] is True
    plain = load_experiment(write(tmp_path, BASE + "deadline_guard: {}\n"))
    assert plain.serve_rules == {} and plain.rule_params() == plain.trained_rule_params()


def test_training_environments_get_the_trained_rules(tmp_path: Path) -> None:
    from rlsched.train.run_steps import worlds_actions
    from rlsched.train.trainer import _env_kwargs

    exp = load_experiment(write(tmp_path, BASE + "deadline_guard: {}\n"
                                "serve_rules: {deadline_guard: {trust_deadline: true}}\n"))
    assert _env_kwargs(exp)["rules"] == exp.trained_rule_params()
    assert _env_kwargs(exp)["rules"]["deadline_guard"]["trust_deadline"] is False
    assert worlds_actions([], exp).to_dict() == worlds_actions([], replace(exp, serve_rules={})).to_dict()


def test_consolidation_is_off_unless_given(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, BASE)).consolidate is None
    exp = load_experiment(write(tmp_path, BASE + "consolidate: {}\n"))
    assert exp.rule_params() == {"consolidate": {"min_hold_s": 900.0, "max_reclaim_rate_per_h": 0.05,
                                                 "restart_overhead_s": 60.0}}


def test_long_job_preemption_is_off_unless_given(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, BASE)).preempt_long is None
    exp = load_experiment(write(tmp_path, BASE + "preempt_long: {factor: 20}\n"))
    assert exp.rule_params() == {"preempt_long": {"factor": 20.0, "min_gain_gpu_s": 3600.0, "scan": 4,
                                                  "restart_overhead_s": 60.0}}


def test_mig_resplit_is_off_unless_given_and_owns_the_re_splits(tmp_path: Path) -> None:
    from rlsched.policies.rules import owned_actions

    assert load_experiment(write(tmp_path, BASE)).mig_resplit is None
    exp = load_experiment(write(tmp_path, BASE + "mig_resplit: {max_per_pass: 1}\n"))
    assert exp.rule_params() == {"mig_resplit": {"max_per_pass": 1, "scan": 256}}
    assert owned_actions(exp.rule_params()) == {"reconfigure"}


def test_every_rule_has_an_experiment_key_in_acting_order() -> None:
    from rlsched.policies.rules import RULES
    from rlsched.train.config import RULE_PARAMS

    assert list(RULE_PARAMS) == list(RULES)


def test_eval_window_must_not_overlap_training(tmp_path: Path) -> None:
    text = BASE.replace("[[20, 30]]", "[[5, 30]]")
    with pytest.raises(ExperimentError, match="overlaps the training window"):
        load_experiment(write(tmp_path, text))


def test_missing_scenario_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="file not found"):
        load_experiment(write(tmp_path, BASE.replace("bundled:default", "nope.yaml")))
    with pytest.raises(ExperimentError, match=r"exp.yaml:\d+:\d+: invalid YAML"):
        load_experiment(write(tmp_path, "name: [unclosed\n"))
    with pytest.raises(ExperimentError, match="experiment file not found"):
        load_experiment(tmp_path / "absent.yaml")


def test_training_scenario_needs_a_window(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="needs train_window_h"):
        load_experiment(write(tmp_path, BASE.replace("    train_window_h: [0, 10]\n", "")))


def test_forecast_block_defaults_and_off(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, BASE))
    assert exp.forecast.model == "smoothed-seasonal" and exp.forecast.enabled
    assert exp.forecast.horizon_s == 3600.0
    assert exp.flat_params()["forecast.model"] == "smoothed-seasonal"
    naive = load_experiment(write(tmp_path, BASE + "forecast: {model: seasonal-naive, season_s: 604800}\n"))
    assert naive.forecast.model_params() == {"season_s": 604800}
    off = load_experiment(write(tmp_path, BASE + "forecast: {model: none}\n"))
    assert not off.forecast.enabled


def test_gate_and_generated_keys(tmp_path: Path) -> None:
    from rlsched.train.config import ExperimentError, GateParams, load_experiment

    base = (Path(__file__).resolve().parents[2] / "experiments" / "smoke.yaml").read_text()
    base = "\n".join(line for line in base.splitlines() if not line.startswith("gate:"))

    def load(extra: str) -> Any:
        p = tmp_path / "e.yaml"
        p.write_text(base + "\n" + extra + "\n")
        return load_experiment(p)

    assert load("").gate == GateParams() and load("").generated is None  # the gate is on by default
    assert load("gate: off").gate is None
    g = load("gate: {families: [gen-gang, traces], windows: 2, max_jobs: 300}").gate
    assert g.families == ("gen-gang", "traces") and g.windows == 2 and g.max_jobs == 300
    gen = load("generated: {count: 8, jobs: 200, seed: 5, exclude: [gang, bursty]}").generated
    assert gen.count == 8 and gen.exclude == ("gang", "bursty") and gen.families == ()
    named = load("generated: {count: 8, exclude: [gang], families: [tiny-fleet, steady], family_count: 3}").generated
    assert named.families == ("tiny-fleet", "steady") and named.family_count == 3
    assert load("").generated_markets is None
    gm = load("generated_markets: {count: 6, seed: 3, exclude: [mkt-volatile]}").generated_markets
    assert (gm.count, gm.seed, gm.exclude) == (6, 3, ("mkt-volatile",))
    for bad, msg in (("gate: {families: [gen-gnag]}", "did you mean 'gen-gang'"),
                     ("gate: {families: gen-gang}", "a non-empty list"),
                     ("gate: {windows: 0}", "windows must be >= 1"),
                     ("gate: {famillies: [all]}", "famillies"),
                     ("generated: {exclude: [gangs]}", "unknown family 'gangs'"),
                     ("generated: {count: 10, seed: 995}", r"seed \+ count <= 1000"),
                     ("generated: {families: [tiny-flet]}", "generated.families: unknown family 'tiny-flet'"),
                     ("generated: {families: tiny-fleet}", "a list of generator family names"),
                     ("generated: {exclude: [gang], families: [gang]}", "'gang' is also in generated.exclude"),
                     ("generated: {count: 4, seed: 990, families: [steady], family_count: 20}",
                      r"seed \+ family_count <= 1000"),
                     ("generated: 3", "expected a mapping"),
                     ("generated_markets: {exclude: [mkt-volatil]}", "unknown market family 'mkt-volatil'"),
                     ("generated_markets: {exclude: mkt-volatile}", "a list of market family names"),
                     ("generated_markets: {count: 0}", r"count >= 1 and seed \+ count <= 1000"),
                     ("generated_markets: {count: 12, seed: 990}", r"seed \+ count <= 1000"),
                     ("generated_markets: {cnt: 3}", "cnt"),
                     ("generated_markets: [1]", "expected a mapping")):
        with pytest.raises(ExperimentError, match=msg):
            load(bad)
