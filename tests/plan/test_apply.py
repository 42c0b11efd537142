"""The apply executor against the in-memory fake backend: order, batches, failures, staleness, fingerprints."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rlsched.plan.apply import Applier, ApplyOptions, ApplyResult, check_not_stale
from rlsched.plan.diff import Action, Plan, plan
from rlsched.plan.errors import ApplyError, NodeChangedError, StalePlanError
from rlsched.plan.state import State, StateStore
from rlsched.runtime.backend import BackendError, GpuInfo
from rlsched.spec.model import Spec

from .fakes import FakeBackend, make_spec


class Clock:
    """A fake clock that sleep() advances, so drain timeouts take no real time."""

    def __init__(self) -> None:
        self.t = 0.0

    def sleep(self, s: float) -> None:
        self.t += max(s, 0.01)

    def __call__(self) -> float:
        return self.t


class CountingStore(StateStore):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes = 0

    def write(self, state: State) -> None:
        self.writes += 1
        super().write(state)


def run(spec: Spec, be: FakeBackend, store: StateStore, **kw: Any) -> tuple[Plan, ApplyResult]:
    clock = Clock()
    p = plan(spec, be.inventory(), store.read(), running_jobs=be.jobs)
    assert not p.errored, p.diagnostics
    opts = ApplyOptions(sleep=clock.sleep, clock=clock, **kw)
    return p, Applier(p, be, store, store.read(), opts).run()


def test_apply_then_plan_has_no_changes_and_state_is_written_after_every_step(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 2, "n2": 2})
    spec = make_spec({"t": ("n1",), "r": ("n2",)}, mig_pools=("r",))
    store = CountingStore(tmp_path / "s.json")
    p, res = run(spec, be, store)
    st = store.read()
    assert st is not None
    assert st.serial == store.writes == len(st.journal)  # one persisted write per journaled step
    assert st.lineage == p.lineage
    assert (res.added, res.adopted, res.gpus_reconfigured, res.nodes_drained) == (4, 2, 2, 1)
    assert not plan(spec, be.inventory(), st).has_changes
    gpu = st.get("gpu", "GPU-n2-0")
    assert gpu is not None and gpu.name == "n2/0" and gpu.attributes["mig_enabled"] is True
    assert len(gpu.observed["mig_uuids"]) == 4
    assert be.nodes["n2"]["cordoned"] is False


def test_disruptive_order_cordon_drain_mode_layout_uncordon(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 1})
    run(make_spec({"r": ("n1",)}, mig_pools=("r",)), be, StateStore(tmp_path / "s.json"))
    assert [c[0] for c in be.calls] == ["cordon", "mode", "layout", "cordon"]
    assert be.calls[0][2] is True and be.calls[-1][2] is False
    st = StateStore(tmp_path / "s.json").read()
    assert st is not None
    steps = [e["step"] for e in st.journal if e["status"] == "done" and e["address"] != "pool.r"]
    assert steps == ["enrol", "cordon", "drain", "reconfigure", "assert", "uncordon"]


@pytest.mark.parametrize("max_unavailable", [1, 2, 3])
def test_batches_respect_max_unavailable(tmp_path: Path, max_unavailable: int) -> None:
    hosts = ("n1", "n2", "n3")
    be = FakeBackend(dict.fromkeys(hosts, 1))
    run(make_spec({"r": hosts}, mig_pools=("r",), max_unavailable=max_unavailable), be,
        StateStore(tmp_path / "s.json"))
    cordoned: set[str] = set()
    peak = 0
    for call in be.calls:
        if call[0] == "cordon":
            (cordoned.add if call[2] else cordoned.discard)(call[1])
            peak = max(peak, len(cordoned))
    assert peak == max_unavailable


def test_drain_timeout_fails_the_node_leaves_it_cordoned_and_next_plan_is_the_rest(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 1, "n2": 1})
    spec = make_spec({"r": ("n1", "n2")}, mig_pools=("r",), drain_timeout_s=30)
    store = StateStore(tmp_path / "s.json")
    be.jobs["n1"] = 2
    with pytest.raises(ApplyError, match=r"n1: drain: timed out after 30s \(2 jobs still running\)"):
        run(spec, be, store)
    assert be.nodes["n1"]["cordoned"] is True
    st = store.read()
    assert st is not None
    assert st.journal[-1]["status"] == "failed" and st.journal[-1]["node_state"] == "failed"
    node = st.get("node", "n1")
    assert node is not None and node.observed["status"] == "failed" and node.observed["cordoned_by_rlsched"]
    # n2 was never started (apply stops after the failed batch); the next plan is exactly the rest
    rest = plan(spec, be.inventory(), st)
    assert sorted(c.address for c in rest.actionable) == ["gpu.n1/0", "gpu.n2/0"]
    be.jobs["n1"] = 0
    run(spec, be, store)
    after = store.read()
    assert after is not None and not plan(spec, be.inventory(), after).has_changes
    assert be.nodes["n1"]["cordoned"] is False


def test_backend_failure_marks_node_failed(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 2})
    be.fail[("layout", "n1")] = BackendError("creating MIG instances failed")
    store = StateStore(tmp_path / "s.json")
    spec = make_spec({"r": ("n1",)}, mig_pools=("r",))
    with pytest.raises(ApplyError, match="creating MIG instances failed"):
        run(spec, be, store)
    assert be.nodes["n1"]["cordoned"] is True
    st = store.read()
    assert st is not None
    rest = plan(spec, be.inventory(), st)
    assert [c.address for c in rest.actionable] == ["gpu.n1/0", "gpu.n1/1"]
    run(spec, be, store)
    assert not plan(spec, be.inventory(), store.read()).has_changes


def test_assert_catches_a_backend_that_lies(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 1})
    real = be.set_mig_layout

    def lying(host: str, uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        info = real(host, uuid, {"7g.80gb": 1})
        return info

    be.set_mig_layout = lying  # type: ignore[method-assign,assignment]
    with pytest.raises(ApplyError, match="assert"):
        run(make_spec({"r": ("n1",)}, mig_pools=("r",)), be, StateStore(tmp_path / "s.json"))
    assert be.nodes["n1"]["cordoned"] is True


def test_cordon_left_over_is_cleared_by_the_next_apply(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 1})
    spec = make_spec({"r": ("n1",)}, mig_pools=("r",))
    store = StateStore(tmp_path / "s.json")
    p = plan(spec, be.inventory(), None)
    real = be.cordon

    def cordon(host: str, on: bool) -> None:  # the final uncordon fails
        if not on:
            raise BackendError("api server down")
        real(host, on)

    be.cordon = cordon  # type: ignore[method-assign,assignment]
    with pytest.raises(ApplyError, match="uncordon"):
        Applier(p, be, store, None, ApplyOptions(sleep=lambda s: None)).run()
    be.cordon = real  # type: ignore[method-assign]
    rest = plan(spec, be.inventory(), store.read())
    assert [(c.address, c.action) for c in rest.actionable] == [("node.n1", Action.UPDATE)]
    assert "uncordon" in rest.actionable[0].reasons[0]
    run(spec, be, store)
    assert be.nodes["n1"]["cordoned"] is False
    assert not plan(spec, be.inventory(), store.read()).has_changes


def test_release_drains_uncordons_and_forgets(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 1, "n2": 2})
    store = StateStore(tmp_path / "s.json")
    run(make_spec({"t": ("n1", "n2")}), be, store)
    be.calls.clear()
    _, res = run(make_spec({"t": ("n1",)}), be, store)
    assert [c[:3] for c in be.calls] == [("cordon", "n2", True), ("cordon", "n2", False)]
    st = store.read()
    assert st is not None and st.get("node", "n2") is None
    assert not [r for r in st.of_type("gpu") if r.observed["host"] == "n2"]
    assert res.destroyed == 1


def test_stale_plan_is_refused() -> None:
    be = FakeBackend({"n1": 1})
    st = State.empty()
    st.serial = 7
    p = plan(make_spec({"t": ("n1",)}), be.inventory(), st)
    st.serial = 8
    with pytest.raises(StalePlanError, match=r"Saved plan is stale: state serial 8 != plan serial 7 \(lineage "):
        check_not_stale(p, st)
    with pytest.raises(StalePlanError, match="lineage"):
        check_not_stale(p, State.empty())
    with pytest.raises(StalePlanError, match="there is no state"):
        check_not_stale(p, None)
    fresh = plan(make_spec({"t": ("n1",)}), be.inventory(), None)
    check_not_stale(fresh, None)  # a plan against no state applies while there is still none


def test_node_changed_since_plan_is_refused_before_touching_it(tmp_path: Path) -> None:
    be = FakeBackend({"n1": 1, "n2": 1})
    spec = make_spec({"r": ("n1", "n2")}, mig_pools=("r",))
    p = plan(spec, be.inventory(), None)
    be.set_layout("n2", 0, {"3g.40gb": 2})
    store = StateStore(tmp_path / "s.json")
    msg = r"^n2 changed since plan \(GPU 0 MIG mode now enabled\); run plan again"
    with pytest.raises(NodeChangedError, match=msg):
        Applier(p, be, store, None, ApplyOptions(sleep=lambda s: None)).run()
    assert not any(c[1] == "n2" for c in be.calls)  # never touched
    assert be.nodes["n2"]["cordoned"] is False
    st = store.read()
    assert st is not None and st.journal[-1]["status"] == "refused"
