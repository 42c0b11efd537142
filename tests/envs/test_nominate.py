"""Job slots filled by nomination: every heuristic's next placement is one action away."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlsched.cluster.decisions import Place
from rlsched.cluster.job import Job
from rlsched.cluster.model import ClusterState, JobRun, Placement
from rlsched.cluster.shorthand import parse_cluster
from rlsched.envs.codec import ObservationCodec
from rlsched.envs.nominate import NOMINATORS, Nomination, NominationError
from rlsched.policies import make_policy
from rlsched.train.teacher import TeacherScheduler, teacher_action

ROOT = Path(__file__).resolve().parents[2]


def _learn(st: ClusterState, user: str, duration: float, gpus: int = 1, n: int = 5) -> None:
    for i in range(n):
        st.estimator.observe(Job(f"{user}-done-{i}", 0.0, duration, num_gpus=gpus, user=user), duration)


def _deep_queue() -> ClusterState:
    """One 8-GPU node half used by user `busy`; 400 queued jobs of four users, the interesting ones deep."""
    st = ClusterState(parse_cluster("1x8xV100-16GB"))
    node = st.add_node(next(iter(st.pools)), 0.0, 0.0)
    jobs = [Job(f"big{i:03d}", float(i), 36_000.0, num_gpus=8, user="big") for i in range(300)]
    jobs += [Job(f"long{i:02d}", 300.0 + i, 36_000.0, user="busy", priority=0) for i in range(50)]
    jobs += [Job(f"short{i:02d}", 400.0 + i, 60.0, user="quick") for i in range(30)]
    jobs += [Job(f"idle{i:02d}", 500.0 + i, 7_200.0, user="idle") for i in range(20)]
    for j in jobs:
        st.enqueue(JobRun(j))
    _learn(st, "big", 36_000.0, gpus=8)
    _learn(st, "busy", 36_000.0)
    _learn(st, "quick", 60.0)
    _learn(st, "idle", 7_200.0)
    # user `busy` already holds four GPUs: fair-share serves `idle` next
    for i in range(4):
        run = JobRun(Job(f"run{i}", 0.0, 1e6, user="busy"))
        st.allocate(run, Placement(node.pool, ((node.id, i),)))
        st.running[run.job.job_id] = run
    st.time = 1_000.0
    return st


def _first_place(state: ClusterState, name: str) -> str:
    policy = make_policy(name)
    policy.reset(state)
    return next(d.job_id for d in policy.decide(state) if isinstance(d, Place))


@pytest.mark.parametrize("name", ["weighted-priority", "sjf", "fair-share"])
def test_each_nominators_next_placement_is_its_rank_zero_slot(name: str) -> None:
    st = _deep_queue()
    codec = ObservationCodec(window=16, nominators=NOMINATORS)
    runs = codec.window_runs(st)
    cols = codec.nomination_columns(st)
    j = NOMINATORS.index(name)
    top = [r.job.job_id for r, c in zip(runs, cols[:, j], strict=True) if c == 1.0]
    assert top == [_first_place(st, name)]


def test_window_reaches_deep_jobs_and_flags_are_features() -> None:
    st = _deep_queue()
    codec = ObservationCodec(window=16, nominators=NOMINATORS)
    ids = {r.job.job_id for r in codec.window_runs(st)}
    assert any(i.startswith("short") for i in ids)  # SJF's picks, 300+ jobs deep
    assert len(ids) == 16
    obs = codec.encode(st)
    assert obs["jobs"].shape == (16, len(codec.job_features))
    assert codec.job_features[-5:] == (*(f"nominated_{n}" for n in NOMINATORS), "user_gpu_share")
    assert codec.observation_space.contains(obs)
    share = obs["jobs"][:, -1]
    busy = [i for i, r in enumerate(codec.window_runs(st)) if r.job.user == "busy"]
    assert busy and all(share[i] == pytest.approx(1.0) for i in busy)  # `busy` holds every running GPU


def test_follow_teacher_places_what_the_heuristic_would() -> None:
    st = _deep_queue()
    codec = ObservationCodec(window=16, nominators=NOMINATORS)
    for name in ("sjf", "fair-share"):
        a = teacher_action(codec, st, codec.mask(st), rule=f"follow:{name}")
        d = codec.decode(a, st)
        assert isinstance(d, Place) and d.job_id == _first_place(st, name)
    with pytest.raises(ValueError, match="nominating"):
        teacher_action(ObservationCodec(window=16), st, codec.mask(st), rule="follow:sjf")


def test_signature_names_nominators_and_the_default_layout_is_unchanged() -> None:
    shipped = json.loads((ROOT / "models" / "scorer" / "codec.json").read_text())["signature"]
    assert ObservationCodec(window=16, max_pools=4).signature() == shipped
    nom = ObservationCodec(window=16, max_pools=4, nominators=NOMINATORS)
    assert nom.signature() != shipped
    assert nom.signature() != ObservationCodec(window=16, max_pools=4, nominators=("sjf", "fifo")).signature()
    assert nom.describe()["nominators"] == list(NOMINATORS)


@pytest.mark.parametrize(("names", "message"), [
    ((), "at least one"),
    (("sjf", "lifo"), "unknown heuristic 'lifo'"),
    (("sjf", "sjf"), "at most once"),
    (NOMINATORS, "at least as many job slots"),
])
def test_bad_nominator_lists_are_one_clear_error(names: tuple[str, ...], message: str) -> None:
    with pytest.raises(NominationError, match=message):
        Nomination(names, window=2 if message.startswith("at least as") else 16)


def test_teacher_scheduler_with_nominators_replays_a_world() -> None:
    from rlsched.scenario import load_scenario
    from rlsched.sim.engine import Engine

    sc = load_scenario({"name": "t", "cluster": "2x8xV100-16GB",
                        "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 150}], "load_factor": 1.2})
    rep = Engine(sc.pools, sc.jobs, sc.market, sc.sim).run(TeacherScheduler("follow:sjf", nominators=NOMINATORS))
    assert rep.result()["jobs_completed"] == 150
    with pytest.raises(ValueError, match="unknown teacher"):
        TeacherScheduler("follow:sjf")  # a follow teacher needs its nominator in the codec


def test_follow_teacher_re_splits_mig_gpus_like_the_heuristic() -> None:
    """A re-split still in progress counts as the pass's: the teacher must not re-split one idle GPU per step."""
    import collections

    from rlsched.cluster.decisions import Reconfigure
    from rlsched.train.evaluate import run_world
    from rlsched.train.families import resolve

    world = resolve(["gen-fractional"])[0].windows(1, 300)[0]

    class Counting:
        def __init__(self, inner: object) -> None:
            self.inner, self.count = inner, collections.Counter()

        def reset(self, state: ClusterState) -> None:
            self.inner.reset(state)  # type: ignore[attr-defined]

        def decide(self, state: ClusterState):  # type: ignore[no-untyped-def]
            for d in self.inner.decide(state):  # type: ignore[attr-defined]
                self.count[isinstance(d, Reconfigure)] += 1
                yield d

    heuristic, teacher = Counting(make_policy("sjf")), Counting(TeacherScheduler("follow:sjf", nominators=NOMINATORS))
    run_world(world, heuristic)
    run_world(world, teacher)
    assert heuristic.count[True] > 0
    assert teacher.count[True] <= 2 * heuristic.count[True]


def test_a_layout_in_flight_is_not_offered_again() -> None:
    """While one GPU of a MIG pool is being re-split to a layout, no other GPU is offered the same layout."""
    from rlsched.envs.gpu_pool import GpuPoolEnv
    from rlsched.scenario import load_scenario

    sc = load_scenario({"name": "mig", "cluster": "1x8xA100-80GB/mig=balanced",
                        "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 20}]})
    env = GpuPoolEnv(sc, nominators=NOMINATORS)
    env.reset(seed=0)
    codec, st = env.codec, env.engine.state
    n_l = codec.layouts
    mask = codec.mask(st)
    offered = [li for li in range(n_l) if mask[codec.reconfigure_offset + li]]
    assert offered, "an idle balanced GPU can be re-split"
    li = offered[0]
    env.step(codec.reconfigure_offset + li)
    st = env.engine.state
    assert any(g.busy_until > st.time for n in st.nodes.values() for g in n.gpus)  # the re-split takes time
    assert not codec.mask(st)[codec.reconfigure_offset + li]
    assert any(codec.mask(st)[codec.reconfigure_offset + other] for other in offered if other != li)
