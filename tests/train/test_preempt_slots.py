"""Preempt slots end to end: network logits, model folders, the preempting teacher, experiments, training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlsched.cluster.decisions import Place, Preempt
from rlsched.cluster.feasibility import pool_candidates
from rlsched.cluster.job import Job
from rlsched.cluster.shorthand import parse_cluster
from rlsched.envs.codec import ObservationCodec
from rlsched.envs.trained_actions import TrainedActions
from rlsched.learned.ppo import PolicyModel, PpoScheduler
from rlsched.learned.ppo_net import SlotScorer
from rlsched.learned.ppo_numpy import NumpySlotScorer
from rlsched.sim.engine import Engine
from rlsched.train.config import ExperimentError, load_experiment
from rlsched.train.teacher import TeacherScheduler, teacher_action
from tests.train.test_config import BASE, write

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("r", "layouts"), [(0, 6), (4, 6), (4, 0)])
def test_numpy_logits_equal_torch(r: int, layouts: int) -> None:
    import torch

    torch.manual_seed(r + layouts)
    codec = ObservationCodec(window=8, max_pools=3, layouts=layouts, preempt_slots=r)
    net = SlotScorer(codec.observation_space, n_layouts=layouts, hidden=32)
    assert net.n_actions == codec.n_actions
    rng = np.random.default_rng(7)
    mirror = NumpySlotScorer.from_module(net)
    for _ in range(5):
        obs = {k: rng.normal(size=s.shape).astype(np.float32) for k, s in codec.observation_space.spaces.items()}
        for a in obs.values():
            if a.ndim == 2:
                a[:, 0] = rng.random(a.shape[0]) < 0.6  # presence flags, some slots empty
        with torch.no_grad():
            ref = net({k: torch.as_tensor(v)[None] for k, v in obs.items()})[0, : net.n_actions].numpy()
        got = mirror.logits(obs)
        assert got.shape == (codec.n_actions,)
        np.testing.assert_allclose(got, ref, atol=1e-5)


def _contended(*, learn: bool = True) -> Engine:
    """One 8-GPU node held by two long preemptible jobs; a short 4-GPU job arrives at t=3600 and is blocked."""
    jobs = [Job("long1", 0.0, 72_000.0, num_gpus=4, user="l", preemptible=True),
            Job("long2", 0.0, 72_000.0, num_gpus=4, user="l", preemptible=True),
            Job("short", 3600.0, 300.0, num_gpus=4, user="s", preemptible=True)]
    eng = Engine(parse_cluster("1x8xA100-80GB"), jobs)
    st = eng.state
    if learn:
        for i in range(5):
            st.estimator.observe(Job(f"l{i}", 0.0, 72_000.0, num_gpus=4, user="l"), 72_000.0)
            st.estimator.observe(Job(f"s{i}", 0.0, 300.0, num_gpus=4, user="s"), 300.0)
    eng.advance()
    pool = next(iter(st.pools.values()))
    for jid in ("long1", "long2"):
        assert eng.apply(Place(jid, pool_candidates(pool, st.queue[jid].job, st.time)[0])) is None
    eng.advance()
    assert "short" in st.queue
    return eng


def test_follow_teacher_preempts_for_a_blocked_short_job_only_with_preempt_slots() -> None:
    st = _contended().state
    codec = ObservationCodec(window=4, max_pools=1, nominators=("sjf",), preempt_slots=2)
    a = teacher_action(codec, st, codec.mask(st), rule="follow:sjf")
    assert codec.preempt_offset <= a < codec.wait_action
    victim = codec.decode(a, st)
    assert isinstance(victim, Preempt) and victim.job_id in ("long1", "long2")
    plain = ObservationCodec(window=4, max_pools=1, nominators=("sjf",))
    assert teacher_action(plain, st, plain.mask(st), rule="follow:sjf") == plain.wait_action
    # believed work not far longer (the estimator knows nothing): no preemption
    st2 = _contended(learn=False).state
    codec2 = ObservationCodec(window=4, max_pools=1, nominators=("sjf",), preempt_slots=2)
    assert teacher_action(codec2, st2, codec2.mask(st2), rule="follow:sjf") == codec2.wait_action


def test_teacher_scheduler_with_preempt_slots_finishes_the_short_job_first() -> None:
    eng = _contended()
    for d in TeacherScheduler("follow:sjf", window=4, max_pools=1, nominators=("sjf",), preempt_slots=2).decide(
            eng.state):
        assert eng.apply(d) is None
    assert eng.state.running.get("short") is not None  # a long job was suspended and the short one placed
    assert eng.preemptions == 1


def _folder(tmp_path: Path, r: int) -> Path:
    import torch

    torch.manual_seed(0)
    codec = ObservationCodec(preempt_slots=r)
    net = SlotScorer(codec.observation_space)
    with torch.no_grad():
        net.preempt_head[2].bias.fill_(5.0)  # make the untrained net use the action
    every = TrainedActions.unrestricted().place
    actions = TrainedActions(every, frozenset(), frozenset(), frozenset(), True, "test", preempt=True)
    return PolicyModel.save(tmp_path / "m", net, codec, {"name": "t"}, trained_actions=actions)


def test_model_folder_with_preempt_slots_saves_loads_and_simulates(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 4)
    meta = json.loads((folder / "codec.json").read_text())
    assert meta["preempt_slots"] == 4
    model = PolicyModel.load(folder)
    assert model.codec_params["preempt_slots"] == 4 and model.trained_actions is not None
    assert model.trained_actions.preempt
    codec = model.new_codec()
    assert codec.preempt_slots == 4 and codec.signature() == meta["signature"]
    eng = _contended()
    obs = codec.encode(eng.state)
    np.testing.assert_allclose(model.logits(obs), model.torch_logits(obs), atol=1e-5)
    decisions = list(PpoScheduler(model).decide(eng.state))
    assert any(isinstance(d, Preempt) and d.reason == "policy" for d in decisions)
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "rlsched", "simulate", "-q", "--max-jobs", "40", "--horizon", "14400",
                           "--preemptible", "all", "-p", f"ppo:{folder}", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (res,) = json.loads(out.read_text())["results"]
    assert res["policy"] == "ppo:m" and res["refused_decisions"] == 0


def test_preempt_slots_key(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, BASE)).preempt_slots == 0
    assert load_experiment(write(tmp_path, BASE + "preempt_slots: 4\n")).preempt_slots == 4
    for bad in ("-1", "2.5", "yes", "[4]"):
        with pytest.raises(ExperimentError, match="preempt_slots must be an integer >= 0"):
            load_experiment(write(tmp_path, BASE + f"preempt_slots: {bad}\n"))


def _preempt_experiment(tmp_path: Path) -> Path:
    """A tiny experiment whose one 8-GPU world is held by long jobs while short ones keep arriving."""
    rows = ["job_id,submit_time,duration,num_gpus,user,preemptible"]
    rows += [f"long{i},{i * 60},{72_000 + i * 600},1,long,1" for i in range(12)]
    rows += [f"short{i},{3600 + i * 150},{240 + (i % 5) * 60},1,short,1" for i in range(300)]
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    return write(tmp_path, f"""
name: smoke-preempt
scenarios:
  - name: long-and-short
    scenario: {{cluster: 1x8xA100-80GB, workload: [{{path: "{trace}"}}]}}
    train_window_h: [0, 10]
    eval_windows_h: [[10, 13]]
episode_jobs: 200
eval_max_jobs: 30
n_envs: 1
vec_env: dummy
total_steps: 256
ppo: {{n_steps: 128, batch_size: 64, n_epochs: 1}}
bc: {{steps: 300, epochs: 1, teacher: "follow:sjf"}}
nominators: [sjf, fifo]
preempt_slots: 4
checkpoint_every_steps: 100000
gate: off
output: {tmp_path / 'model'}
""")


def test_behaviour_cloning_data_shows_the_preempt_action(tmp_path: Path) -> None:
    from rlsched.train.run_steps import codec_of, prepare_worlds
    from rlsched.train.trainer import collect_teacher

    exp = load_experiment(_preempt_experiment(tmp_path))
    data = collect_teacher(exp, prepare_worlds(exp, lambda _: None).training, 1200, log=lambda _: None)
    codec = codec_of(exp)
    preempts = (data.actions >= codec.preempt_offset) & (data.actions < codec.wait_action)
    assert preempts.sum() > 0
    assert data.masks[np.arange(len(data.actions)), data.actions].all()  # every teacher action is legal
    assert data.obs["running"].shape == (1200, 4, len(codec.running_features))


def test_an_experiment_with_preempt_slots_trains(tmp_path: Path) -> None:
    from rlsched.train.trainer import train

    exp = load_experiment(_preempt_experiment(tmp_path))
    res = train(exp, run_dir=tmp_path / "run", log=lambda _: None, quiet=True, track=False)
    model = PolicyModel.load(res.model_dir)
    assert model.codec_params["preempt_slots"] == 4
    assert model.trained_actions is not None and model.trained_actions.preempt
    assert json.loads((res.model_dir / "actions.json").read_text())["preempt"] is True
    assert model.new_codec().preempt_slots == 4


def test_retrain_keeps_the_source_models_preempt_slots(tmp_path: Path) -> None:
    from rlsched.train.retrain import _source_settings

    keys, *_ = _source_settings(str(_folder(tmp_path, 4)), tmp_path / "work")
    assert keys["preempt_slots"] == 4  # else the retrained experiment's codec would not fit its weights
    keys, *_ = _source_settings(str(ROOT / "models" / "scorer"), tmp_path / "work")
    assert "preempt_slots" not in keys


def test_retrain_from_a_selector_is_one_line_saying_why() -> None:
    from rlsched.errors import RlschedError
    from rlsched.train.retrain import _source_settings

    # the shipped default is a heuristic selector: nothing per-slot to fine-tune
    with pytest.raises(RlschedError, match=r"^--from .*models/default: a heuristic selector cannot be fine-tuned") as e:
        _source_settings(str(ROOT / "models" / "default"), ROOT / "unused")
    assert "\n" not in str(e.value)
