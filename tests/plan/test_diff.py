"""Unit tests of the diff: each symbol and reason, adoption, unknown nodes, drift, declared-only."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlsched.plan.diff import Action, Change, Plan, plan
from rlsched.plan.render import NO_CHANGES, render_json, render_plan
from rlsched.plan.state import ResourceRecord, State
from rlsched.spec.model import PolicyDecl, QuotaDecl, Spec

from .fakes import BALANCED, FakeBackend, make_spec


def applied_state(spec: Spec, be: FakeBackend) -> State:
    """The state a successful apply of ``spec`` on ``be`` would leave (built through the Applier)."""
    from rlsched.plan.apply import Applier, ApplyOptions
    from rlsched.plan.state import StateStore

    class _Mem(StateStore):
        def __init__(self) -> None:
            self.saved: State | None = None

        def write(self, state: State) -> None:
            state.serial += 1
            self.saved = state

    store = _Mem()
    p = plan(spec, be.inventory(), None)
    Applier(p, be, store, None, ApplyOptions(drain_poll_s=0.0)).run()
    assert store.saved is not None
    return store.saved


def by_addr(p: Plan) -> dict[str, Change]:
    return {c.address: c for c in p.changes}


def test_empty_state_creates_config_enrols_nodes_and_adopts_matching_gpus() -> None:
    be = FakeBackend({"n1": 2})
    spec = make_spec({"train": ("n1",)}, quotas={"q": QuotaDecl("q", "train", "team:a", max_gpus=4)},
                     policies={"default": PolicyDecl("default", "rl")})
    p = plan(spec, be.inventory(), None)
    ch = by_addr(p)
    assert ch["pool.train"].action is Action.CREATE
    assert ch["quota.q"].action is Action.CREATE and ch["quota.q"].depends_on == ("pool.train",)
    assert ch["policy.default"].action is Action.CREATE
    assert ch["node.n1"].action is Action.CREATE and ch["node.n1"].after == {"pool": "train"}
    gpu = ch["gpu.n1/0"]
    assert gpu.action is Action.NOOP and gpu.adopt and gpu.key == "GPU-n1-0"
    assert "gpu.n1/0 will be adopted (layout already matches)" in gpu.reasons
    s = p.summary
    assert (s.adopt, s.add, s.change, s.destroy, s.gpus_to_reconfigure, s.nodes_to_drain) == (2, 4, 0, 0, 0, 0)
    assert p.has_changes
    assert p.lineage and p.serial == 0  # a lineage is minted even for empty state
    text = render_plan(p)
    assert "gpu.n1/0 will be adopted (layout already matches)" in text
    assert "Plan: 2 to adopt, 4 to add, 0 to change, 0 to destroy. 0 GPUs to reconfigure, 0 nodes to drain." in text


def test_two_plans_against_no_state_get_different_lineages() -> None:
    be = FakeBackend({"n1": 1})
    spec = make_spec({"train": ("n1",)})
    assert plan(spec, be.inventory(), None).lineage != plan(spec, be.inventory(), None).lineage


def test_layout_change_is_replace_with_recreate_reason_and_drain() -> None:
    be = FakeBackend({"n1": 2})
    spec = make_spec({"r": ("n1",)}, mig_pools=("r",))
    st = applied_state(spec, be)
    be.jobs["n1"] = 3
    new = make_spec({"r": ("n1",)}, mig_pools=("r",), layout={"3g.40gb": 2}, drain_timeout_s=900)
    p = plan(new, be.inventory(), st, running_jobs=be.jobs)
    c = by_addr(p)["gpu.n1/0"]
    assert c.action is Action.REPLACE and c.action.value == "-/+" and c.action.is_replace()
    assert c.before == {"mig_enabled": True, "mig_layout": BALANCED}
    assert c.after == {"mig_enabled": True, "mig_layout": {"3g.40gb": 2}}
    assert "recreates all 4 MIG instances on GPU-n1-0: destroys 4, creates 2" in c.reasons
    assert "DISRUPTIVE: drains node n1: 3 jobs (drain_timeout 15m)" in c.reasons
    assert c.disruptive and c.running_jobs == 3
    # the drain reason is given once per node, on its first change
    assert not any("drains node" in r for r in by_addr(p)["gpu.n1/1"].reasons)
    assert p.summary.gpus_to_reconfigure == 2 and p.summary.nodes_to_drain == 1
    text = render_plan(p)
    assert '-/+ gpu "n1/0" { ~ mig_layout = {"1g.10gb"=2,"2g.20gb"=1,"3g.40gb"=1} -> {"3g.40gb"=2} }' in text
    assert "Plan: 0 to add, 1 to change, 0 to destroy. 2 GPUs to reconfigure, 1 node to drain." in text


def test_mig_mode_change_is_update_needing_reset() -> None:
    be = FakeBackend({"n1": 1})
    be.set_layout("n1", 0, {"7g.80gb": 1})
    p = plan(make_spec({"t": ("n1",)}), be.inventory(), None)
    c = by_addr(p)["gpu.n1/0"]
    assert c.action is Action.UPDATE and c.action.value == "~"
    assert "needs GPU reset (MIG mode enabled -> disabled)" in c.reasons
    assert "destroys all 1 MIG instances on GPU-n1-0" in c.reasons
    assert '~ gpu "n1/0" { ~ mig_enabled = true -> false }' in render_plan(p)


def test_pending_mode_needs_reset_even_when_current_matches() -> None:
    be = FakeBackend({"n1": 1})
    be.gpu("n1", 0)["pending"] = True  # enable requested, reset not done
    c = by_addr(plan(make_spec({"t": ("n1",)}), be.inventory(), None))["gpu.n1/0"]
    assert c.action is Action.UPDATE and "needs GPU reset" in c.reasons


def test_enabling_mig_shows_layout_and_reset_reason() -> None:
    be = FakeBackend({"n1": 1})
    p = plan(make_spec({"r": ("n1",)}, mig_pools=("r",)), be.inventory(), None)
    c = by_addr(p)["gpu.n1/0"]
    assert c.action is Action.REPLACE
    assert c.reasons[:2] == ("needs GPU reset (MIG mode disabled -> enabled)", "creates 4 MIG instances on GPU-n1-0")
    assert "drains node n1: 0 jobs, idle" in c.reasons[2]


def test_matching_gpu_in_state_is_no_change_and_no_changes_message() -> None:
    be = FakeBackend({"n1": 2, "n2": 2})
    spec = make_spec({"t": ("n1",), "r": ("n2",)}, mig_pools=("r",))
    st = applied_state(spec, be)
    p = plan(spec, be.inventory(), st)
    assert not p.has_changes and not p.drift
    assert render_plan(p) == NO_CHANGES + "\n"
    assert p.lineage == st.lineage and p.serial == st.serial


def test_telemetry_never_creates_a_change() -> None:
    be = FakeBackend({"n1": 2})
    spec = make_spec({"t": ("n1",)})
    st = applied_state(spec, be)
    be.jobs["n1"] = 12
    be.nodes["n1"]["cordoned"] = True  # cordoned by someone else: not a declared attribute
    for g in be.nodes["n1"]["gpus"]:
        g["processes"] = 5
    p = plan(spec, be.inventory(), st, running_jobs=be.jobs)
    assert not p.has_changes and not p.drift


def test_placement_is_ignored_only_counts_matter() -> None:
    be = FakeBackend({"n1": 1})
    spec = make_spec({"r": ("n1",)}, mig_pools=("r",))
    st = applied_state(spec, be)
    g = be.gpu("n1", 0)
    g["devices"] = list(reversed(g["devices"]))  # same counts, other order/placement
    assert not plan(spec, be.inventory(), st).has_changes


def test_drift_section_lists_declared_attributes_changed_outside() -> None:
    be = FakeBackend({"n1": 2})
    spec = make_spec({"r": ("n1",)}, mig_pools=("r",))
    st = applied_state(spec, be)
    be.set_layout("n1", 1, {"1g.10gb": 7})
    p = plan(spec, be.inventory(), st)
    assert [(d.address, d.attribute, d.before, d.after) for d in p.drift] == [
        ("gpu.n1/1", "mig_layout", BALANCED, {"1g.10gb": 7})]
    assert by_addr(p)["gpu.n1/1"].action is Action.REPLACE
    text = render_plan(p)
    assert text.startswith("Note: objects changed outside rlsched (declared attributes only)\n"
                           '  ~ gpu.n1/1  mig_layout: {"1g.10gb"=2,"2g.20gb"=1,"3g.40gb"=1} -> {"1g.10gb"=7}\n')


def test_drift_back_to_desired_is_adopted_not_replaced() -> None:
    be = FakeBackend({"n1": 1})
    spec = make_spec({"r": ("n1",)}, mig_pools=("r",))
    st = applied_state(spec, be)
    new = make_spec({"r": ("n1",)}, mig_pools=("r",), layout={"7g.80gb": 1})
    be.set_layout("n1", 0, {"7g.80gb": 1})  # someone already made it what the spec now asks
    p = plan(new, be.inventory(), st)
    c = by_addr(p)["gpu.n1/0"]
    assert c.adopt and c.action is Action.NOOP
    assert p.drift and p.summary.gpus_to_reconfigure == 0


def test_unreachable_node_is_unknown_and_never_planned_away() -> None:
    be = FakeBackend({"n1": 1, "n2": 1})
    spec = make_spec({"t": ("n1", "n2")})
    st = applied_state(spec, be)
    be.nodes["n2"]["reachable"] = False
    # still declared: unknown
    p = plan(spec, be.inventory(), st)
    assert by_addr(p)["node.n2"].action is Action.UNKNOWN
    assert not p.has_changes
    text = render_plan(p)
    assert text.startswith(NO_CHANGES) and '  ? node "n2"' in text
    # removed from the spec: still unknown, not released
    p = plan(make_spec({"t": ("n1",)}), be.inventory(), st)
    assert by_addr(p)["node.n2"].action is Action.UNKNOWN
    assert not any(c.action is Action.DELETE for c in p.changes)
    # not reported at all
    del be.nodes["n2"]
    p = plan(spec, be.inventory(), st)
    assert by_addr(p)["node.n2"].action is Action.UNKNOWN
    assert "not reported by the backend" in by_addr(p)["node.n2"].reasons[0]


def test_release_is_delete_with_drain_and_pool_delete() -> None:
    be = FakeBackend({"n1": 1, "n2": 1})
    spec = make_spec({"t": ("n1",), "old": ("n2",)})
    st = applied_state(spec, be)
    be.jobs["n2"] = 1
    p = plan(make_spec({"t": ("n1",)}), be.inventory(), st, running_jobs=be.jobs)
    ch = by_addr(p)
    assert ch["node.n2"].action is Action.DELETE and ch["node.n2"].disruptive
    assert "DISRUPTIVE: drains node n2: 1 job (drain_timeout 1m)" in ch["node.n2"].reasons
    assert ch["pool.old"].action is Action.DELETE
    assert p.summary.destroy == 2 and p.summary.nodes_to_drain == 1
    assert '  - node "n2" { - pool = "old" }' in render_plan(p)


def test_move_between_pools_is_update_with_drain() -> None:
    be = FakeBackend({"n1": 1, "n2": 1})
    st = applied_state(make_spec({"a": ("n1", "n2"), "b": ()}), be)
    p = plan(make_spec({"a": ("n1",), "b": ("n2",)}), be.inventory(), st)
    c = by_addr(p)["node.n2"]
    assert c.action is Action.UPDATE and c.disruptive and c.before == {"pool": "a"} and c.after == {"pool": "b"}
    assert "moves n2 from pool.a to pool.b" in c.reasons


def test_config_update_shows_changed_attributes_only() -> None:
    be = FakeBackend({"n1": 1})
    spec = make_spec({"t": ("n1",)}, quotas={"q": QuotaDecl("q", "t", "team:a", max_gpus=4)})
    st = applied_state(spec, be)
    new = make_spec({"t": ("n1",)}, quotas={"q": QuotaDecl("q", "t", "team:a", max_gpus=8)})
    p = plan(new, be.inventory(), st)
    assert [c.address for c in p.actionable] == ["quota.q"]
    assert '  ~ quota "q" { ~ max_gpus = 4 -> 8 }' in render_plan(p)
    assert p.summary.change == 1


def test_gang_mode_change_is_an_in_place_pool_update_without_drains() -> None:
    be = FakeBackend({"n1": 2})
    spec = make_spec({"t": ("n1",)})
    st = applied_state(spec, be)
    assert st.get("pool", "t").attributes["gang"] == "whole-nodes"
    packed = dataclasses.replace(spec, pools={"t": dataclasses.replace(spec.pools["t"], gang="packed")})
    p = plan(packed, be.inventory(), st)
    assert [(c.address, c.action) for c in p.actionable] == [("pool.t", Action.UPDATE)]
    assert not any(c.disruptive for c in p.changes)
    assert '  ~ pool "t" { ~ gang = "whole-nodes" -> "packed" }' in render_plan(p)
    assert (p.summary.change, p.summary.add, p.summary.destroy) == (1, 0, 0)


def test_state_written_before_gang_existed_plans_no_change() -> None:
    # A pool record without "gang" was written when every pool placed gangs on whole nodes.
    be = FakeBackend({"n1": 2})
    spec = make_spec({"t": ("n1",)})
    st = applied_state(spec, be)
    old = st.get("pool", "t")
    st.put(ResourceRecord("pool", "t", old.key, {k: v for k, v in old.attributes.items() if k != "gang"},
                          old.observed, old.depends_on))
    assert not plan(spec, be.inventory(), st).has_changes
    packed = dataclasses.replace(spec, pools={"t": dataclasses.replace(spec.pools["t"], gang="packed")})
    assert '~ gang = "whole-nodes" -> "packed"' in render_plan(plan(packed, be.inventory(), st))


def test_prevent_destroy_blocks_pool_removal_and_node_release() -> None:
    be = FakeBackend({"n1": 1, "n2": 1})
    spec = make_spec({"t": ("n1", "n2")}, prevent_destroy=("t",))
    st = applied_state(spec, be)
    p = plan(make_spec({"t": ("n1",)}, prevent_destroy=("t",)), be.inventory(), st)
    assert p.errored and p.diagnostics[0].summary == "Instance cannot be destroyed"
    assert "releases node n2" in p.diagnostics[0].detail
    p = plan(make_spec({}), be.inventory(), st)
    assert p.errored and any("pool.t" in d.detail for d in p.diagnostics)
    # lifting prevent_destroy first is the way out
    assert not plan(make_spec({"t": ("n1",)}), be.inventory(), st).errored


def test_gpu_model_mismatch_and_illegal_layout_are_errors() -> None:
    be = FakeBackend({"n1": 1}, model="A100-80GB")
    p = plan(make_spec({"t": ("n1",)}), be.inventory(), None)
    assert p.errored and p.diagnostics[0].summary == "GPU model mismatch"
    be = FakeBackend({"n1": 1})
    p = plan(make_spec({"r": ("n1",)}, mig_pools=("r",), layout={"1g.10gb": 8}), be.inventory(), None)
    assert p.errored and p.diagnostics[0].summary == "Invalid MIG layout"
    assert '8 × "1g.10gb" does not fit' in p.diagnostics[0].detail  # noqa: RUF001


def test_node_in_two_pools_is_an_error() -> None:
    be = FakeBackend({"n1": 1})
    p = plan(make_spec({"a": ("n1",), "b": ("n1",)}), be.inventory(), None)
    assert p.errored and p.diagnostics[0].summary == "Node in two pools"


def test_gpu_subset_and_forgetting_unmanaged_gpus() -> None:
    be = FakeBackend({"n1": 3})
    spec = make_spec({"t": ("n1",)})
    st = applied_state(spec, be)
    sub = dataclasses.replace(spec, pools={"t": dataclasses.replace(spec.pools["t"], gpus=(0, 1))})
    p = plan(sub, be.inventory(), st)
    c = by_addr(p)["gpu.n1/2"]
    assert c.action is Action.DELETE and not c.disruptive and "layout kept" in c.reasons[0]


def test_uncordon_left_over_by_a_failed_apply() -> None:
    be = FakeBackend({"n1": 1})
    spec = make_spec({"t": ("n1",)})
    st = applied_state(spec, be)
    rec = st.get("node", "n1")
    assert rec is not None
    st.put(ResourceRecord("node", "n1", "n1", rec.attributes, {**rec.observed, "cordoned_by_rlsched": True}))
    be.nodes["n1"]["cordoned"] = True
    c = by_addr(plan(spec, be.inventory(), st))["node.n1"]
    assert c.action is Action.UPDATE and not c.disruptive and "uncordon" in c.reasons[0]
    be.nodes["n1"]["cordoned"] = False  # someone uncordoned it already: nothing to do
    assert not plan(spec, be.inventory(), st).has_changes


def test_action_enum_is_its_glyph() -> None:
    assert [a.value for a in Action] == ["=", "+", "~", "-", "-/+", "+/-", "?"]
    assert Action("-/+") is Action.REPLACE and Action.CREATE_THEN_DELETE.is_replace()
    assert not Action.UPDATE.is_replace()


def test_plan_round_trips_through_json() -> None:
    be = FakeBackend({"n1": 2})
    p = plan(make_spec({"r": ("n1",)}, mig_pools=("r",)), be.inventory(), None)
    doc = json.loads(render_json(p))
    again = Plan.from_json(doc)
    assert again.changes == p.changes and again.lineage == p.lineage and again.nodes == p.nodes
    assert doc["summary"]["gpus_to_reconfigure"] == 2 and doc["summary"]["has_changes"] is True
    assert doc["changes"][-1]["action"] == "-/+" and doc["changes"][-1]["action_name"] == "replace"


@pytest.mark.parametrize("n", [1, 3, 8])
def test_adoption_lines_collapse_per_node(n: int) -> None:
    be = FakeBackend({"n1": n})
    text = render_plan(plan(make_spec({"t": ("n1",)}), be.inventory(), None))
    if n >= 3:
        assert f"# gpu.n1/0-{n - 1} ({n} GPUs) will be adopted (layout already matches)" in text
    else:
        assert "# gpu.n1/0 will be adopted (layout already matches)" in text


def test_prevent_destroy_recorded_only_in_state_still_blocks_every_release() -> None:
    # The pool's block is gone from the spec: state's record of prevent_destroy is what holds.
    be = FakeBackend({"n1": 1, "n2": 1})
    st = applied_state(make_spec({"t": ("n1", "n2")}, prevent_destroy=("t",)), be)
    p = plan(make_spec({}), be.inventory(), st)
    details = [d.detail.split(", but ")[1].split(".")[0] for d in p.diagnostics]
    assert details == ["the plan destroys it (its block was removed)",
                       "the plan releases node n1 from it", "the plan releases node n2 from it"]
    assert all(d.range is None for d in p.diagnostics)


def test_moving_a_node_out_of_a_protected_pool_is_an_error() -> None:
    be = FakeBackend({"n1": 1, "n2": 1})
    st = applied_state(make_spec({"a": ("n1", "n2"), "b": ()}, prevent_destroy=("a",)), be)
    p = plan(make_spec({"a": ("n1",), "b": ("n2",)}, prevent_destroy=("a",)), be.inventory(), st)
    assert [d.detail.split(", but ")[1].split(".")[0] for d in p.diagnostics] == ["the plan moves node n2 out of it"]
    assert by_addr(p)["node.n2"].action is Action.UPDATE
