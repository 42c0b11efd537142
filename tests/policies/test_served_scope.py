"""A served model acts only through what it was trained with; a complementing heuristic takes the rest.

Runs the shipped ``models/scorer`` (trained on on-prem V100 fleets only) on the bundled default
scenario and on ``envs/hybrid-openb-mig.yaml`` (elastic spot and on-demand pools, MIG pools). Before
its codec masked the untrained kinds it alternated ``scale +1`` / ``scale -1`` on these fleets and
never finished; :class:`Recording` turns such a livelock into a failure instead of a hang.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlsched.cluster.decisions import Decision, Place, Reconfigure, Scale
from rlsched.cluster.model import ClusterState, PoolKind
from rlsched.envs.trained_actions import ACTIONS_FILE, TrainedActions
from rlsched.learned.ppo import ModelError, PolicyModel, PpoScheduler
from rlsched.scenario import load_scenario
from rlsched.sim import Engine

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "scorer"
#: decisions a 300-job replay may take; the livelocked model took 256 per decision point
DECISION_CAP = 20_000


class Recording:
    """A scheduler wrapper that records who decided what, and fails a run that keeps deciding."""

    def __init__(self, inner: PpoScheduler) -> None:
        self.inner = inner
        self.name = inner.name
        self.model: list[tuple[Decision, str]] = []
        self.complement: list[Decision] = []
        self._in_complement = False
        comp = inner.complement
        assert comp is not None
        own = comp.decide

        def tagged(state: ClusterState) -> Iterator[Decision]:
            self._in_complement = True
            try:
                yield from own(state)
            finally:
                self._in_complement = False

        comp.decide = tagged  # type: ignore[method-assign]

    def reset(self, state: ClusterState) -> None:
        self.inner.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for d in self.inner.decide(state):
            if len(self.model) + len(self.complement) > DECISION_CAP:
                raise AssertionError(f"more than {DECISION_CAP} decisions: the policy is looping")
            if self._in_complement:
                self.complement.append(d)
            else:
                pool = d.placement.pool if isinstance(d, Place) else d.pool if isinstance(d, Scale) else ""
                self.model.append((d, state.pools[pool].spec.kind.value if pool else ""))
            yield d


def _replay(scenario: Any, n: int) -> tuple[Recording, Any]:
    sc = load_scenario(scenario)
    jobs = sorted(sc.jobs, key=lambda j: j.submit_time)[:n]
    sched = Recording(PpoScheduler(PolicyModel.load(DEFAULT_MODEL)))
    report = Engine(sc.pools, jobs, sc.market, sc.sim).run(sched)
    assert report.jobs_completed + report.jobs_unschedulable + report.jobs_skipped == len(jobs)
    return sched, report


@pytest.mark.parametrize("scenario", [None, str(ROOT / "envs" / "hybrid-openb-mig.yaml")],
                         ids=["bundled-default", "hybrid-openb-mig"])
def test_the_on_prem_model_finishes_elastic_fleets_and_never_acts_outside_its_training(scenario: str | None) -> None:
    model = PolicyModel.load(DEFAULT_MODEL)
    assert model.trained_actions is not None
    assert model.trained_actions.place == frozenset({PoolKind.ONPREM})
    assert not (model.trained_actions.scale_up | model.trained_actions.scale_down | model.trained_actions.reconfigure)
    sched, report = _replay(scenario, 300)
    # the network only placed on on-prem pools: no scaling, no MIG re-split, nothing on spot/on-demand
    assert sched.model and {kind for d, kind in sched.model if isinstance(d, Place)} == {"onprem"}
    assert not any(isinstance(d, Scale | Reconfigure) for d, _ in sched.model)
    # the elastic pools were still used: the complement bought nodes and placed jobs there
    assert any(isinstance(d, Scale) and d.delta > 0 for d in sched.complement)
    assert any(isinstance(d, Place) for d in sched.complement)
    assert report.loop_handovers == 0  # masking removed the loop; the detector had nothing to do
    reasons = report.unschedulable_reasons
    assert not any(k.startswith(("never placed", "unfinished")) for k in reasons), reasons


def test_a_model_inside_its_record_is_served_unchanged() -> None:
    # models/spot was trained on spot + on-demand fleets: on such a fleet nothing is masked or complemented
    spot = PolicyModel.load(ROOT / "models" / "spot")
    assert spot.trained_actions is not None
    sc = load_scenario(ROOT / "envs" / "philly-hybrid-v100.yaml")
    assert spot.trained_actions.covers(sc.pools, max_pools=4, layouts=6)
    sched = PpoScheduler(spot)
    eng = Engine(sc.pools, sorted(sc.jobs, key=lambda j: j.submit_time)[:20], sc.market, sc.sim)
    eng.reset()
    sched.reset(eng.state)
    assert sched.complement is not None and not sched.complement.active


def test_a_folder_without_the_record_loads_conservatively_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, folder)
    (folder / ACTIONS_FILE).unlink()
    rec = PolicyModel.load(folder).trained_actions
    assert rec is not None and rec.place == frozenset(PoolKind) and rec.wait
    assert not (rec.reconfigure | rec.scale_up | rec.scale_down)
    assert "missing" in rec.source
    (folder / ACTIONS_FILE).write_text(json.dumps({"format": 1, "place": ["onprem", "moon"]}))
    with pytest.raises(ModelError, match=r"actions\.json: corrupted \('place': unknown pool kind 'moon'"):
        PolicyModel.load(folder)
    # saving a model writes its record, and saving without one removes a stale record
    model = PolicyModel.load(DEFAULT_MODEL)
    codec = model.new_codec()
    assert model.trained_actions is not None
    PolicyModel.save(folder, model.net, codec, trained_actions=model.trained_actions)
    assert PolicyModel.load(folder).trained_actions == model.trained_actions
    PolicyModel.save(folder, model.net, codec)
    assert not (folder / ACTIONS_FILE).exists()


def test_the_trainer_records_what_its_training_fleets_offer() -> None:
    from rlsched.train.config import load_experiment
    from rlsched.train.run_steps import worlds_actions
    from rlsched.train.worlds import training_worlds

    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    rec = worlds_actions(training_worlds(exp.scenarios), exp)
    # the smoke experiment trains on the bundled hybrid fleet: on-prem (one pool in MIG mode), spot, on-demand
    assert rec == TrainedActions(frozenset(PoolKind), frozenset({PoolKind.ONPREM}),
                                 frozenset({PoolKind.SPOT, PoolKind.ONDEMAND}),
                                 frozenset({PoolKind.SPOT, PoolKind.ONDEMAND}), True, rec.source)
    assert "bundled-default" in rec.source
    # the shipped records say what their experiments' fleets offered
    default = TrainedActions.from_dict(json.loads((DEFAULT_MODEL / ACTIONS_FILE).read_text()))
    assert default.describe() == "place: onprem; reconfigure: -; scale up: -; scale down: -; wait"
    spot = TrainedActions.from_dict(json.loads((ROOT / "models" / "spot" / ACTIONS_FILE).read_text()))
    assert spot.describe() == ("place: ondemand,spot; reconfigure: -; scale up: ondemand,spot; "
                               "scale down: ondemand,spot; wait")


def test_simulate_names_a_corrupted_record_in_one_line(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, folder)
    (folder / ACTIONS_FILE).write_text('{"format": 1, "place": "onprem"}')
    cmd = [sys.executable, "-m", "rlsched", "simulate", "-q", "-p", f"ppo:{folder}", "--max-jobs", "10"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {folder / ACTIONS_FILE}: corrupted ('place' must be a list of pool kinds (onprem, ondemand, spot))"]


def test_simulate_reports_the_hand_overs_of_a_looping_model(tmp_path: Path) -> None:
    # the shipped network with every action allowed (no masking): the simulator's loop breaker catches it
    import os
    import shutil
    import subprocess
    import sys

    folder = tmp_path / "unmasked"
    shutil.copytree(DEFAULT_MODEL, folder)
    (folder / ACTIONS_FILE).write_text(json.dumps(TrainedActions.unrestricted("test").to_dict()))
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "rlsched", "simulate", "-p", f"ppo:{folder}", "--max-jobs", "100", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    n = json.loads(out.read_text())["results"][0]["loop_handovers"]
    assert n > 0
    assert f"ppo:unmasked: {n} decision points handed to weighted-priority (a decision loop without progress)" \
        in " ".join(proc.stdout.split())
