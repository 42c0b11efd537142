"""An anchored network (its teacher's choice added to its logits): what it is before any training,
the numpy mirror, the model folder, and an experiment that asks for one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlsched.envs.codec import ObservationCodec
from rlsched.learned.ppo import ModelError, PolicyModel, load_policy_ref
from rlsched.learned.ppo_net import ANCHOR_WEIGHT, SlotScorer
from rlsched.train.config import load_experiment
from rlsched.train.evaluate import run_world
from rlsched.train.families import SpotFamily
from rlsched.train.run_steps import codec_of
from rlsched.train.teacher import TeacherScheduler

ROOT = Path(__file__).resolve().parents[2]
RULES = {"deadline_guard": {"preempt": True, "gangs_off_spot": True, "backlog_buy": True}, "consolidate": {}}


def _anchored_folder(tmp_path: Path, teacher: str = "sjf-spot-first") -> Path:
    import torch

    torch.manual_seed(0)
    codec = ObservationCodec(window=16, max_pools=4).anchor_to(teacher)
    trained = load_policy_ref(str(ROOT / "models" / "spot")).trained_actions  # spot + on-demand, as spot.yaml trains
    return PolicyModel.save(tmp_path / "m", SlotScorer(codec.observation_space), codec, {}, rules=RULES,
                            trained_actions=trained)


def test_an_untrained_anchored_network_schedules_as_its_teacher(tmp_path: Path) -> None:
    """Its own logits start near zero, so the anchor decides every greedy choice: the replay is the teacher's,
    behind the same rules, decision for decision - PPO starts from the heuristic, not from a clone of it."""
    model = load_policy_ref(str(_anchored_folder(tmp_path)))
    world = SpotFamily("t", "", "philly-early", "mkt-volatile", "V100-16GB", spot_nodes=8).windows(1, 200)[0]
    mine = run_world(world, model.scheduler("anchored")).result()
    teacher = run_world(world, TeacherScheduler("sjf-spot-first", 16, 4, rules=RULES)).result()
    for key in ("cost_usd", "deadline_misses", "mean_jct_s", "restarts"):
        assert mine[key] == teacher[key], key


@pytest.mark.parametrize("teacher", ["sjf-spot-first", "sjf-spot-reserve"])
def test_an_untrained_anchored_network_is_its_teacher_where_the_fleet_empties(tmp_path: Path, teacher: str) -> None:
    """Philly hours 1154-1202 under a mkt-volatile draw: the fleet empties between jobs while a queued job fits
    nowhere and arrivals are still due. Training lets a policy wait there, and so does the served loop now
    (``ObservationCodec.unstranded`` reads the simulator's next event). When the served loop masked waiting
    wherever nothing ran, the network could not take its teacher's "wait" and its own scores bought on-demand
    nodes: 34,252 USD against sjf-spot-first's 30,491 in this window (BENCHMARKS.md, "A teacher for bursts")."""
    model = load_policy_ref(str(_anchored_folder(tmp_path, teacher)))
    fam = SpotFamily("t", "", "philly-early", "mkt-volatile", "V100-16GB", spot_nodes=8)
    world = next(w for w in fam.windows(12, 800, seed0=500) if "1154-1202h" in w.label)
    mine = run_world(world, model.scheduler("anchored")).result()
    ref = run_world(world, TeacherScheduler(teacher, 16, 4, rules=RULES)).result()
    for key in ("cost_usd", "deadline_misses", "mean_jct_s", "restarts"):
        assert mine[key] == ref[key], key


def test_the_numpy_mirror_adds_the_anchor_as_torch_does(tmp_path: Path) -> None:
    import torch

    model = PolicyModel.load(_anchored_folder(tmp_path))
    space = model.new_codec().observation_space
    rng = np.random.default_rng(0)
    for _ in range(5):
        obs = {k: rng.uniform(0.0, 1.0, size=v.shape).astype(np.float32) for k, v in space.spaces.items()}
        obs["jobs"][:, 0] = obs["pools"][:, 0] = 1.0  # present slots
        hot = np.zeros_like(obs["anchor"])
        hot[int(rng.integers(0, len(hot)))] = 1.0
        obs["anchor"] = hot
        assert model.numpy_net is not None
        got, want = model.numpy_net.logits(obs), model.torch_logits(obs)
        assert np.allclose(got, want, atol=1e-4)
        with torch.no_grad():
            bare = model.torch_logits({**obs, "anchor": np.zeros_like(hot)})
        assert np.allclose(want - bare, ANCHOR_WEIGHT * hot, atol=1e-4)


def test_the_folder_records_the_anchor_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    folder = _anchored_folder(tmp_path)
    meta = json.loads((folder / "codec.json").read_text())
    assert meta["anchor"] == "sjf-spot-first"
    model = PolicyModel.load(folder)
    assert model.new_codec().anchor == "sjf-spot-first"
    meta["anchor"] = "best-follow"
    (folder / "codec.json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match=r"codec.json: unknown anchor teacher 'best-follow' \(a codec-space"):
        PolicyModel.load(folder)


def test_an_experiment_anchors_its_codec(tmp_path: Path) -> None:
    spot = (ROOT / "experiments" / "spot.yaml").read_text().replace("../", f"{ROOT}/")
    path = tmp_path / "anchored.yaml"
    path.write_text(spot.replace("window: 16\n", "window: 16\nanchor: sjf-spot-first\n"))
    exp = load_experiment(path)
    assert exp.anchor == "sjf-spot-first"
    assert codec_of(exp).anchor == "sjf-spot-first"
    assert "anchor" in codec_of(exp).observation_space.spaces
    assert load_experiment(ROOT / "experiments" / "spot.yaml").anchor is None


def test_the_final_evaluation_shows_the_teacher_an_anchored_network_started_as() -> None:
    from dataclasses import replace

    from rlsched.train.config import BcParams
    from rlsched.train.run_steps import teacher_rows

    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    assert [r().name for r in teacher_rows(exp)] == ["teacher:weighted-priority"]  # cloned from, not anchored
    anchored = replace(exp, anchor="sjf")
    assert [r().name for r in teacher_rows(anchored)] == ["teacher:weighted-priority", "teacher:sjf"]
    # without cloning the anchor is still the teacher it started as; anchored to its clone's teacher: one row
    assert [r().name for r in teacher_rows(replace(anchored, bc=BcParams(steps=0)))] == ["teacher:sjf"]
    same = replace(exp, anchor="weighted-priority")
    assert [r().name for r in teacher_rows(same)] == ["teacher:weighted-priority"]
    # a spot teacher brings every other spot teacher along, as the family benchmark does
    spot = replace(exp, anchor="sjf-spot-reserve", bc=BcParams(steps=0))
    assert [r().name for r in teacher_rows(spot)] == ["teacher:sjf-spot-reserve", "teacher:sjf-spot-first"]
