"""Item 3 of issue 20 in pieces: trace families in experiments, warm starts, the retrain gate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlsched.cluster.job import Job
from rlsched.train.config import ExperimentError, load_experiment
from rlsched.workload import write_canonical

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "scorer"


def trace(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "jobs.csv"
    write_canonical(path, [Job(str(i), i * 60.0, 300.0 + 10 * i, num_gpus=1 + i % 4) for i in range(n)])
    return path


def experiment(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text("name: t\nbc: {steps: 0}\n" + extra)
    return path


def test_trace_families_split_the_history_in_time(tmp_path: Path) -> None:
    trace(tmp_path)
    exp = load_experiment(experiment(tmp_path, "trace_families:\n  - {path: jobs.csv, fleet: 2x8xH100-80GB, "
                                               "eval_fraction: 0.25}\n"))
    (entry,) = exp.scenarios
    assert entry.name == "jobs" and entry.scenario["cluster"] == "2x8xH100-80GB"
    assert entry.train_window_h == (0.0, 30 * 60 / 3600)  # the first 30 of 40 jobs train
    ((a, b),) = entry.eval_windows_h
    assert a == 30 * 60 / 3600 and b > 39 * 60 / 3600  # the later days evaluate
    from rlsched.train.worlds import evaluation_worlds, training_worlds

    (train,) = training_worlds(exp.scenarios)
    (ev,) = evaluation_worlds(exp.scenarios, 1000)
    assert len(train.scenario.jobs) == 30 and len(ev.scenario.jobs) == 10
    assert {j.job_id for j in ev.scenario.jobs} == {str(i) for i in range(30, 40)}  # the last ten submitted


def test_trace_families_mix_with_scenarios(tmp_path: Path) -> None:
    trace(tmp_path)
    exp = load_experiment(experiment(tmp_path, "scenarios:\n  - {name: b, scenario: 'bundled:default', "
                                               "train_window_h: [0, 12]}\n"
                                               "trace_families: [{path: jobs.csv, fleet: 1x8xA100-80GB}]\n"))
    assert [e.name for e in exp.scenarios] == ["b", "jobs"]


@pytest.mark.parametrize(("extra", "words"), [
    ("trace_families: [{path: nope.csv, fleet: 1x8xA100-80GB}]\n", "nope.csv"),
    ("trace_families: [{path: jobs.csv, fleet: 1x8xA100-80GB, eval_fraction: 1.5}]\n", "eval_fraction"),
    ("trace_families: [{path: jobs.csv}]\n", "missing 'fleet'"),
    ("trace_families: [{path: jobs.csv, fleet: 1x8xA100-80GB, colour: red}]\n", "colour"),
    ("trace_families: [{path: jobs.csv, fleet: 1x8xA100-80GB}]\ninit_from: no-such-folder\n", "model folder not"),
])
def test_bad_trace_families_and_init_from_are_one_line(tmp_path: Path, extra: str, words: str) -> None:
    trace(tmp_path)
    with pytest.raises(ExperimentError) as err:
        load_experiment(experiment(tmp_path, extra))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_warm_start_loads_weights_when_the_codec_matches(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from rlsched.envs.codec import ObservationCodec
    from rlsched.learned.ppo import PolicyModel
    from rlsched.learned.ppo_net import SlotScorer
    from rlsched.train.warm_start import warm_start

    source = PolicyModel.load(DEFAULT_MODEL)
    trace(tmp_path)
    exp = load_experiment(experiment(tmp_path, f"trace_families: [{{path: jobs.csv, fleet: 1x8xA100-80GB}}]\n"
                                               f"init_from: {DEFAULT_MODEL}\n"))
    codec = ObservationCodec(window=exp.window, max_pools=exp.max_pools, nominators=exp.nominators)
    fresh = SlotScorer(codec.observation_space, n_layouts=6, hidden=64)
    model = SimpleNamespace(policy=SimpleNamespace(features_extractor=fresh))
    assert codec.signature() == source.signature
    warm_start(model, exp, codec.signature(), lambda _m: None)
    for (k, a), b in zip(fresh.state_dict().items(), source.net.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_warm_start_from_a_selector_is_one_line_saying_why(tmp_path: Path) -> None:
    from rlsched.train.warm_start import warm_start

    trace(tmp_path)
    selector = ROOT / "models" / "default"  # the shipped default is a heuristic selector
    exp = load_experiment(experiment(tmp_path, f"trace_families: [{{path: jobs.csv, fleet: 1x8xA100-80GB}}]\n"
                                               f"init_from: {selector}\n"))
    with pytest.raises(ExperimentError) as err:
        warm_start(None, exp, "any-signature", lambda _m: None)
    assert "init_from:" in str(err.value) and "a heuristic selector cannot be fine-tuned or warm-started" in str(
        err.value) and "\n" not in str(err.value)


def test_warm_start_refuses_another_codec(tmp_path: Path) -> None:
    from rlsched.train.warm_start import warm_start

    trace(tmp_path)
    exp = load_experiment(experiment(tmp_path, f"window: 8\ntrace_families: [{{path: jobs.csv, fleet: "
                                               f"1x8xA100-80GB}}]\ninit_from: {DEFAULT_MODEL}\n"))
    with pytest.raises(ExperimentError) as err:
        warm_start(None, exp, "not-the-signature", lambda _m: None)
    assert "codec signature" in str(err.value) and "window 8" in str(err.value)


def test_the_retrain_gate_is_promotes(tmp_path: Path) -> None:
    from rlsched.train.retrain import gate_checks

    card = {"metrics": {"eval": {"ppo": {"mean_jct_s": 90.0, "cost_usd": 1.0, "jobs_completed": 10},
                                 "weighted-priority": {"mean_jct_s": 100.0, "cost_usd": 1.0, "jobs_completed": 10}}}}
    checks = gate_checks(card)
    assert [c.ok for c in checks][:3] == [True, True, True]
    assert not checks[-1].ok and "no workload-family evaluation" in checks[-1].text


def test_retrain_trains_behind_the_trained_rules_and_serves_the_changes(tmp_path: Path) -> None:
    from rlsched.train.retrain import RetrainOptions, _source_settings, write_experiment

    folder = tmp_path / "spot"
    shutil.copytree(ROOT / "models" / "spot", folder)
    card = json.loads((folder / "card.json").read_text())
    served = {**json.loads((folder / "deadline_guard.json").read_text()), "trust_deadline": True}
    trained = {**served, "trust_deadline": False}
    card.update(serve_rules={"deadline_guard": {"trust_deadline": True}},
                trained_rules={"deadline_guard": trained, "consolidate": card["consolidate"]})
    (folder / "card.json").write_text(json.dumps(card))
    (folder / "deadline_guard.json").write_text(json.dumps(served))
    work = tmp_path / "work"
    keys, name, *_ = _source_settings(str(folder), work)
    assert keys["deadline_guard"] == trained and keys["serve_rules"] == card["serve_rules"]
    work.mkdir()
    opts = RetrainOptions(state_dir=tmp_path, source=str(folder), fleet="2x8xA100-80GB", work_dir=work)
    exp = load_experiment(write_experiment(opts, trace(tmp_path), name, keys))
    assert exp.trained_rule_params()["deadline_guard"] == trained
    assert exp.rule_params()["deadline_guard"] == served
