"""The numpy forward pass used for serving equals the torch network's (logits and decisions)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

from rlsched.cluster.decisions import Decision  # noqa: E402
from rlsched.cluster.model import ClusterState  # noqa: E402
from rlsched.envs.codec import ObservationCodec  # noqa: E402
from rlsched.learned.ppo import PolicyModel, PpoScheduler  # noqa: E402
from rlsched.learned.ppo_net import SlotScorer  # noqa: E402
from rlsched.learned.ppo_numpy import NumpySlotScorer  # noqa: E402
from rlsched.scenario import load_scenario  # noqa: E402
from rlsched.sim import Engine, SimConfig  # noqa: E402

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "scorer"


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Batch-1 torch forwards on a shared CPU are much slower with a thread pool."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _random_obs(space: Any, rng: np.random.Generator, present: float) -> dict[str, np.ndarray]:
    obs = {k: rng.normal(0.0, 1.5, size=space[k].shape).astype(np.float32) for k in ("jobs", "pools", "globals")}
    obs["jobs"][:, 0] = rng.random(obs["jobs"].shape[0]) < present
    obs["pools"][:, 0] = rng.random(obs["pools"].shape[0]) < max(present, 0.5)
    return obs


@pytest.mark.parametrize(("window", "max_pools", "layouts", "hidden"),
                         [(16, 4, 6, 64), (4, 1, 6, 32), (8, 3, 0, 64), (32, 8, 3, 16), (1, 2, 6, 8)])
def test_numpy_logits_equal_torch(window: int, max_pools: int, layouts: int, hidden: int) -> None:
    torch.manual_seed(window * 100 + max_pools * 10 + layouts)
    codec = ObservationCodec(window=window, max_pools=max_pools, layouts=layouts)
    net = SlotScorer(codec.observation_space, n_layouts=layouts, hidden=hidden).eval()
    fast = NumpySlotScorer.from_module(net)
    assert fast.n_actions == net.n_actions == codec.n_actions
    rng = np.random.default_rng(window + max_pools + layouts)
    for i in range(40):
        # present fractions from none (all job slots empty) to all
        obs = _random_obs(codec.observation_space, rng, present=[0.0, 0.3, 0.7, 1.0][i % 4])
        with torch.no_grad():
            want = net({k: torch.as_tensor(v)[None] for k, v in obs.items()})[0, : net.n_actions].numpy()
        got = fast.logits(obs)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_policy_model_serves_through_numpy(tmp_path: Path) -> None:
    codec = ObservationCodec()
    torch.manual_seed(3)
    folder = PolicyModel.save(tmp_path / "m", SlotScorer(codec.observation_space), codec, {})
    model = PolicyModel.load(folder)
    assert isinstance(model.numpy_net, NumpySlotScorer)
    sc = load_scenario()
    eng = Engine(sc.pools, sc.jobs[:40], sc.market, sc.sim)
    eng.advance()
    c = model.new_codec()
    obs = c.encode(eng.state)
    np.testing.assert_allclose(model.logits(obs), model.torch_logits(obs), rtol=1e-5, atol=1e-5)

    def boom(*_: Any, **__: Any) -> Any:
        raise AssertionError("torch forward called while serving")

    model.net.forward = boom  # decisions must not touch torch
    decisions = list(PpoScheduler(model).decide(eng.state))
    assert decisions


class _Recorder:
    """Records every decision a scheduler yields (what the engine was asked to apply)."""

    def __init__(self, inner: PpoScheduler) -> None:
        self.inner = inner
        self.name = inner.name
        self.log: list[str] = []

    def reset(self, state: ClusterState) -> None:
        self.inner.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        for d in self.inner.decide(state):
            self.log.append(f"{state.time:.3f} {d!r}")
            yield d


def _models(tmp_path: Path) -> list[PolicyModel]:
    codec = ObservationCodec()
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        out.append(PolicyModel.load(PolicyModel.save(tmp_path / f"m{seed}", SlotScorer(codec.observation_space),
                                                     codec, {})))
    if DEFAULT_MODEL.is_dir():
        out.append(PolicyModel.load(DEFAULT_MODEL))
    return out


def _torch_twin(model: PolicyModel) -> PolicyModel:
    twin = PolicyModel(model.net, model.codec_params, model.signature, model.card, model.trained_actions)
    twin.numpy_net = None  # force the torch path
    return twin


def test_simulated_decisions_identical_to_torch(tmp_path: Path) -> None:
    sc = load_scenario()
    jobs = sc.jobs[:50]
    for model in _models(tmp_path):
        logs, reports = [], []
        for m in (model, _torch_twin(model)):
            rec = _Recorder(PpoScheduler(m))
            eng = Engine(sc.pools, jobs, sc.market, SimConfig(horizon_s=2 * 86400))
            reports.append(eng.run(rec))
            logs.append(rec.log)
        assert len(logs[0]) > 30
        assert logs[0] == logs[1]
        assert reports[0].jobs_completed == reports[1].jobs_completed
        assert reports[0].mean_jct_s == reports[1].mean_jct_s


def test_busy_cluster_decision_points_identical_to_torch(tmp_path: Path) -> None:
    """The service benchmark's states (64 GPUs, 100 queued): each decision point consumed until it waits."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from decision_latency import build_state

    snaps = [build_state(8, 100, seed) for seed in range(4)] + [build_state(1, 10, 7)]
    for model in _models(tmp_path):
        for snap in snaps:
            seqs = []
            for m in (model, _torch_twin(model)):
                eng = pickle.loads(snap)
                out = []
                for d in PpoScheduler(m).decide(eng.state):
                    out.append(repr(d))
                    eng.apply(d)
                seqs.append(out)
            assert seqs[0] and seqs[0] == seqs[1]
