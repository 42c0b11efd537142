"""The selector model folder and scheduler: exported weights, the hold cadence, loading and bad folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlsched.envs.regime import REGIME_FEATURES, regime_features
from rlsched.learned.ppo import ModelError, load_policy_ref, make_ppo_policy
from rlsched.learned.selector import SelectorError, SelectorModel
from rlsched.policies import make_policy
from rlsched.scenario import load_scenario
from rlsched.sim import Engine

CANDIDATES = ("weighted-priority", "sjf")
F = len(REGIME_FEATURES)


def _constant(k: int, hold_s: float = 3600.0) -> SelectorModel:
    """A selector that always rates candidate ``k`` highest (zero weights, a one-hot bias)."""
    bias = np.zeros(len(CANDIDATES))
    bias[k] = 1.0
    return SelectorModel(CANDIDATES, hold_s, [(np.zeros((4, F)), np.zeros(4)), (np.zeros((len(CANDIDATES), 4)), bias)])


def _backlog(model: SelectorModel) -> SelectorModel:
    """A selector choosing sjf (index 1) when queued GPUs exceed the fleet's, weighted-priority otherwise."""
    w = np.zeros((1, F))
    w[0, REGIME_FEATURES.index("log_queued_gpus_per_gpu")] = 50.0
    out = np.array([[0.0], [1.0]])
    return SelectorModel(CANDIDATES, model.hold_s, [(w, np.array([-50.0 * np.log(2.0)])), (out, np.array([0.0, 0.0]))])


@pytest.fixture(scope="module")
def scenario():  # type: ignore[no-untyped-def]
    return load_scenario({"name": "q", "cluster": "2x8xA100-80GB",
                          "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 150}], "load_factor": 1.2})


def test_a_selector_that_always_picks_one_candidate_is_that_heuristic(scenario) -> None:  # type: ignore[no-untyped-def]
    for k, name in enumerate(CANDIDATES):
        sched = _constant(k).scheduler("sel")
        rep = Engine(scenario.pools, scenario.jobs, scenario.market).run(sched)
        alone = Engine(scenario.pools, scenario.jobs, scenario.market).run(make_policy(name))
        assert rep.mean_jct_s == alone.mean_jct_s
        assert set(sched.choices) == {name}
        assert rep.loop_handovers == 0


def test_choices_follow_the_regime_and_the_hold(scenario) -> None:  # type: ignore[no-untyped-def]
    model = _backlog(_constant(0, hold_s=1800.0))
    sched = model.scheduler()
    engine = Engine(scenario.pools, scenario.jobs, scenario.market)
    sched.reset(engine.state)
    picks: list[tuple[float, str, float]] = []
    while engine.advance():
        before = sum(sched.choices.values())
        x = regime_features(engine.state)
        for d in sched.decide(engine.state):
            engine.apply(d)
        if sum(sched.choices.values()) > before:
            picks.append((engine.now, CANDIDATES[sched.current], float(x[0])))
    assert {name for _, name, _ in picks} == set(CANDIDATES)  # both regimes occur in this replay
    for _, name, backlog in picks:
        assert name == ("sjf" if backlog > np.log(2.0) else "weighted-priority")
    gaps = np.diff([t for t, _, _ in picks])
    assert (gaps >= 1800.0).all()  # one choice holds hold_s


def test_a_candidate_is_reset_when_it_takes_over_as_in_training(scenario) -> None:  # type: ignore[no-untyped-def]
    sched = _backlog(_constant(0, hold_s=1800.0)).scheduler()
    engine = Engine(scenario.pools, scenario.jobs, scenario.market)
    sched.reset(engine.state)
    resets = {name: 0 for name in CANDIDATES}
    for name, h in zip(CANDIDATES, sched.heuristics, strict=True):
        plain = h.reset

        def counted(state, name=name, plain=plain):  # type: ignore[no-untyped-def]
            resets[name] += 1
            plain(state)

        h.reset = counted
    switches, last = {name: 0 for name in CANDIDATES}, 0
    while engine.advance():
        for d in sched.decide(engine.state):
            engine.apply(d)
        if sched.current != last:
            switches[CANDIDATES[sched.current]] += 1
            last = sched.current
    assert switches["sjf"] > 0 and resets == switches  # each take-over, and nothing else


def test_save_load_round_trip_and_the_loader_dispatch(tmp_path: Path) -> None:
    model = _backlog(_constant(0))
    model.card = {"name": "t"}
    model.save(tmp_path / "sel")
    again = load_policy_ref(str(tmp_path / "sel"))
    assert isinstance(again, SelectorModel) and again.signature == model.signature and again.card == {"name": "t"}
    x = np.linspace(0, 2, F)
    assert np.allclose(again.logits(x), model.logits(x))
    sched = make_ppo_policy(str(tmp_path / "sel"))
    assert sched.name == "ppo:sel" and sched.rules == [] and sched.complement is None


def test_export_from_sb3_keeps_the_networks_logits(tmp_path: Path) -> None:
    import torch
    from sb3_contrib import MaskablePPO

    from rlsched.envs.selector_env import SelectorEnv

    sc = load_scenario({"name": "q", "cluster": "1x8xA100-80GB",
                        "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 30}]})
    env = SelectorEnv([sc], CANDIDATES, episode_jobs=None)
    ppo = MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=32, seed=0, device="cpu",
                      policy_kwargs={"net_arch": [16, 16]})
    ppo.learn(64)
    model = SelectorModel.from_sb3(ppo.policy, CANDIDATES, 3600.0)
    xs = np.random.default_rng(0).uniform(0, 3, (20, F)).astype(np.float32)
    with torch.no_grad():
        dist = ppo.policy.get_distribution(torch.as_tensor(xs))
        ref = dist.distribution.logits.numpy()
    ours = np.stack([model.logits(x) for x in xs])
    ours = ours - np.log(np.exp(ours).sum(axis=1, keepdims=True))  # torch's logits are log-probabilities
    assert np.allclose(ours, ref, atol=1e-5)


def _write(folder: Path, **changes: object) -> Path:
    _backlog(_constant(0)).save(folder)
    doc = json.loads((folder / "selector.json").read_text())
    doc.update(changes)
    (folder / "selector.json").write_text(json.dumps(doc))
    return folder


def _unsure(margin: float) -> SelectorModel:
    """Two candidates whose probabilities differ by about 0.1 (weighted-priority ahead), sjf the default."""
    gap = float(np.log(0.55 / 0.45))
    layers = [(np.zeros((4, F)), np.zeros(4)), (np.zeros((2, 4)), np.array([gap, 0.0]))]
    return SelectorModel(CANDIDATES, 3600.0, layers, default="sjf", margin=margin)


def test_an_unsure_choice_goes_to_the_default_and_a_sure_one_does_not() -> None:
    x = np.zeros(F)
    assert _unsure(0.0).choose_features(x) == 0  # no margin: the plain argmax
    assert _unsure(0.05).choose_features(x) == 0  # 0.55 against 0.45: sure enough
    assert _unsure(0.15).choose_features(x) == 1  # not sure enough: the default
    sure = _unsure(0.15)
    sure.layers[-1] = (sure.layers[-1][0], np.array([3.0, 0.0]))
    assert sure.choose_features(x) == 0  # 0.95 against 0.05


def test_the_scheduler_counts_the_choices_its_default_overruled(scenario) -> None:  # type: ignore[no-untyped-def]
    unsure = _unsure(0.15).scheduler()  # the network always prefers weighted-priority, never by enough
    Engine(scenario.pools, scenario.jobs, scenario.market).run(unsure)
    assert set(unsure.choices) == {"sjf"} and unsure.overruled == {"weighted-priority": unsure.choices["sjf"]}
    sure = _unsure(0.05).scheduler()
    Engine(scenario.pools, scenario.jobs, scenario.market).run(sure)
    assert set(sure.choices) == {"weighted-priority"} and not sure.overruled


def test_the_default_and_margin_survive_the_folder_and_an_old_folder_has_neither(tmp_path: Path) -> None:
    _unsure(0.15).save(tmp_path / "new")
    again = SelectorModel.load(tmp_path / "new")
    assert (again.default, again.margin) == ("sjf", 0.15) and again.choose_features(np.zeros(F)) == 1
    old = _write(tmp_path / "old", format=1)
    doc = json.loads((old / "selector.json").read_text())
    del doc["default"], doc["margin"]
    (old / "selector.json").write_text(json.dumps(doc))
    assert (SelectorModel.load(old).default, SelectorModel.load(old).margin) == (None, 0.0)


@pytest.mark.parametrize(("changes", "message"), [
    ({"candidates": ["weighted-priority", "shortest"]}, "candidate 'shortest'"),
    ({"default": "fifo", "margin": 0.1}, "default 'fifo' is not one of the candidates"),
    ({"default": "sjf", "margin": 1.5}, "margin must be in"),
    ({"margin": 0.1}, "needs a default"),
    ({"features": ["queue"]}, "retrain it"),
    ({"format": 99}, "format 99"),
    ({"layers": []}, "do not match"),
    ({"layers": "x"}, "corrupted"),
])
def test_bad_folders_are_model_errors(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    folder = _write(tmp_path / "bad", **changes)
    with pytest.raises(SelectorError, match=message) as info:
        SelectorModel.load(folder)
    assert isinstance(info.value, ModelError) and "\n" not in str(info.value)


def test_simulate_serves_a_selector_folder_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good"
    _constant(1).save(good)
    cmd = [sys.executable, "-m", "rlsched", "simulate", "--policy", f"ppo:{good}", "--policy", "sjf",
           "--max-jobs", "120", "--json", str(tmp_path / "r.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    rows = {r["policy"]: r for r in (doc["results"] if isinstance(doc, dict) and "results" in doc else doc)}
    assert rows[f"ppo:{good.name}"]["mean_jct_s"] == rows["sjf"]["mean_jct_s"]  # it always picks sjf
    bad = _write(tmp_path / "bad", features=["queue"])
    out = subprocess.run([*cmd[:5], f"ppo:{bad}", *cmd[6:]], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "retrain it" in out.stderr and len(out.stderr.strip().splitlines()) == 1
