"""Model folders: save/load round trip, corrupted and mismatched files, the PPO policy in simulate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlsched.envs.codec import ObservationCodec
from rlsched.learned.ppo import ModelError, PolicyModel, PpoScheduler, load_policy_ref, make_ppo_policy
from rlsched.learned.ppo_net import SlotScorer
from rlsched.policies.rules.consolidate import Consolidator
from rlsched.policies.rules.deadline_guard import DeadlineGuard
from rlsched.policies.rules.preempt_long import LongJobPreemption
from rlsched.scenario import load_scenario
from rlsched.sim import Engine, SimConfig


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    import torch

    # Fixed weights: with whatever seed the session left, some random nets scale a pool up
    # and down 256 times per decision point, and the 20-day run below took minutes.
    torch.manual_seed(0)
    codec = ObservationCodec()
    return PolicyModel.save(tmp_path / "m", SlotScorer(codec.observation_space), codec, {"name": "t"})


def test_round_trip_gives_same_logits(folder: Path) -> None:
    a, b = PolicyModel.load(folder), PolicyModel.load(folder)
    sc = load_scenario()
    eng = Engine(sc.pools, sc.jobs[:50], sc.market, sc.sim)
    eng.advance()
    codec = a.new_codec()
    obs, mask = codec.encode(eng.state), codec.mask(eng.state)
    assert np.allclose(a.logits(obs), b.logits(obs))
    act = a.act(obs, mask)
    assert mask[act]
    assert a.card == {"name": "t"}


def test_corrupted_and_missing_files(folder: Path, tmp_path: Path) -> None:
    (folder / "policy.pt").write_bytes(b"not a torch file")
    with pytest.raises(ModelError, match="cannot load policy weights"):
        PolicyModel.load(folder)
    with pytest.raises(ModelError, match="model folder not found"):
        PolicyModel.load(tmp_path / "nothing")
    (folder / "codec.json").write_text("{")
    with pytest.raises(ModelError, match="corrupted"):
        PolicyModel.load(folder)


def test_a_models_uri_goes_through_the_fetcher_the_caller_passes(folder: Path) -> None:
    """The learned layer does not import the registry: a ``models:/`` URI needs the caller's fetcher."""
    with pytest.raises(ModelError, match="needs a registry fetcher"):
        load_policy_ref("models:/smoke@champion")
    asked: list[str] = []

    def fetch(uri: str) -> Path:
        asked.append(uri)
        return folder

    sched = make_ppo_policy("models:/smoke@champion", fetch=fetch)
    assert asked == ["models:/smoke@champion"]
    assert sched.name == "ppo:models:/smoke@champion" and sched.model.card == {"name": "t"}
    assert load_policy_ref(str(folder), fetch=fetch).card == {"name": "t"} and len(asked) == 1  # a folder: not fetched


def test_rules_travel_with_the_model_folder(folder: Path, tmp_path: Path) -> None:
    assert PolicyModel.load(folder).guard_params is None
    assert PpoScheduler(PolicyModel.load(folder)).rules == []
    model = PolicyModel.load(folder)
    codec = model.new_codec()
    PolicyModel.save(folder, model.net, codec, rules={"deadline_guard": {"margin_frac": 0.1, "min_margin_s": 60.0},
                                                      "consolidate": {"min_hold_s": 1200.0},
                                                      "preempt_long": {"factor": 20.0}})
    loaded = PolicyModel.load(folder)
    assert loaded.guard_params == {"margin_frac": 0.1, "min_margin_s": 60.0}
    assert loaded.rule_params["consolidate"] == {"min_hold_s": 1200.0}
    sched = PpoScheduler(loaded)
    guard, consolidator, preempt = sched.rules  # in acting order: the guard first
    assert isinstance(preempt, LongJobPreemption) and preempt.factor == pytest.approx(20.0)
    assert isinstance(guard, DeadlineGuard) and guard.margin_frac == pytest.approx(0.1)
    assert isinstance(consolidator, Consolidator) and consolidator.min_hold_s == pytest.approx(1200.0)
    assert PpoScheduler(loaded, use_rules=False).rules == []
    (folder / "deadline_guard.json").write_text('{"margin_frac": -1}')
    with pytest.raises(ModelError, match=r"deadline_guard\.json: corrupted"):
        PolicyModel.load(folder)
    (folder / "deadline_guard.json").write_text('{"margin_frac": 0.1}')
    (folder / "consolidate.json").write_text('{"min_hold": 1}')
    with pytest.raises(ModelError, match=r"consolidate\.json: corrupted"):
        PolicyModel.load(folder)
    # saved again without rules: the stale files go, so the model is not served with them
    PolicyModel.save(folder, model.net, codec)
    assert not any((folder / f"{name}.json").exists() for name in ("deadline_guard", "consolidate", "preempt_long"))
    assert PolicyModel.load(folder).rule_params == {}


def test_signature_mismatch_is_refused(folder: Path) -> None:
    meta = json.loads((folder / "codec.json").read_text())
    meta["signature"] = "gpupool-codec-v0-deadbeef"
    (folder / "codec.json").write_text(json.dumps(meta))
    model = PolicyModel.load(folder)
    with pytest.raises(ModelError, match="observation signature mismatch"):
        PpoScheduler(model)


def test_ppo_policy_runs_like_a_heuristic(folder: Path) -> None:
    sc = load_scenario()
    jobs = sc.jobs[:80]
    eng = Engine(sc.pools, jobs, sc.market, SimConfig(horizon_s=20 * 86400))
    rep = eng.run(PpoScheduler(PolicyModel.load(folder)))
    assert rep.jobs_completed + rep.jobs_unschedulable + rep.jobs_skipped == len(jobs)
    assert rep.refused_decisions == 0  # the mask only allows what feasibility accepts


def test_simulate_cli_accepts_ppo_folder(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "rlsched", "simulate", "-q", "--max-jobs", "20", "--horizon", "7200",
                           "-p",
                           f"ppo:{folder}", "-p", "weighted-priority", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    names = [r["policy"] for r in json.loads(out.read_text())["results"]]
    assert names == [f"ppo:{folder.name}", "weighted-priority"]
    assert json.loads(out.read_text())["jobs"] == 20
    bad = subprocess.run([sys.executable, "-m", "rlsched", "simulate", "-q", "-p", f"ppo:{tmp_path / 'none'}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "model folder not found" in bad.stderr and "Traceback" not in bad.stderr
