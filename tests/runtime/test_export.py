"""Export: HCL that python-hcl2 parses, and mig-parted YAML that round-trips to the fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from rlsched.runtime.backend import BackendError, GpuInfo, MigDevice, NodeInfo
from rlsched.runtime.export import PCI_IDS, export_fleet, export_hcl, export_mig_parted
from rlsched.runtime.sim_backend import SimulatedBackend, build_fleet, write_json_atomic

SPEC = "2x4xH100-80GB:balanced,1x4xH100-80GB:all-1g,1x2xA100-40GB:balanced,2x2xA100-80GB:all-1g,1x2xV100-16GB"


@pytest.fixture
def nodes(tmp_path: Path) -> list[NodeInfo]:
    path = tmp_path / "fleet.json"
    write_json_atomic(path, build_fleet(SPEC))
    be = SimulatedBackend(path)
    # One A100-80GB GPU differs from its sibling: a heterogeneous node.
    be.set_mig_layout("gpu-a100-02", be.node("gpu-a100-02").gpus[0].uuid, {"7g.80gb": 1})
    return be.inventory()


def _blocks(doc: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k.strip('"'): v for b in doc.get(kind, []) for k, v in b.items()}


def _unq(v: str) -> str:
    return v.strip('"')


def test_hcl_parses_and_describes_every_uniform_node(nodes: list[NodeInfo]) -> None:
    res = export_hcl(nodes, source="sim:test")
    doc = hcl2.loads(res.text)
    layouts = _blocks(doc, "mig_layout")
    pools = _blocks(doc, "pool")
    by_host = {n.hostname: n for n in nodes}
    assert set(res.assignments) == set(by_host)  # the heterogeneous node too, as a partial-GPU pool
    assert any("gpu-a100-02" in w and "partial-GPU pool" in w and "GPU 1" in w for w in res.warnings)
    seen: set[str] = set()
    for name, pool in pools.items():
        assert set(pool) - {"__is_block__"} >= {"gpu_model", "capacity", "nodes"}
        assert _unq(pool["capacity"]) == "on_demand"
        for host in map(_unq, pool["nodes"]):
            assert host not in seen, "a node in two pools"
            seen.add(host)
            assert res.assignments[host] == name
            node = by_host[host]
            gpus = [g for g in node.gpus if "gpus" not in pool or g.index in pool["gpus"]]
            assert gpus and {g.name for g in gpus} == {_unq(pool["gpu_model"])}
            if "mig" in pool:
                assert _unq(pool["mig"]) == "disabled" and not any(g.mig_current for g in gpus)
            else:
                ref = pool["mig_layout"]
                assert ref.startswith("${mig_layout.") and ref.endswith("}")
                devices = layouts[ref[len("${mig_layout."):-1]]["devices"]
                want = {_unq(k): v for k, v in devices.items()}
                assert all(g.layout_counts() == want for g in gpus)
    assert seen == set(res.assignments)
    # Distinct layouts with one conventional name are told apart (balanced on H100 vs A100-40GB).
    assert {"all_1g", "balanced_a100_40gb", "balanced_h100_80gb"} <= set(layouts)
    assert pools["a100_40gb_balanced"]["mig_layout"] == "${mig_layout.balanced_a100_40gb}"
    assert "a100_80gb_all_1g" in pools and "h100_80gb_all_1g" in pools  # one layout, two models
    assert "v100_16gb" in pools


def test_hcl_partial_gpu_pools_validate_and_plan_to_no_change(tmp_path: Path) -> None:
    """Issue 22 item 10: a node with GPUs configured differently is exported, not warned away."""
    from rlsched.plan.diff import plan
    from rlsched.spec import load_spec

    path = tmp_path / "fleet.json"
    write_json_atomic(path, build_fleet("2x4xH100-80GB:balanced,1x2xA100-80GB:all-1g,1x2xV100-16GB"))
    be = SimulatedBackend(path)
    be.set_mig_layout("gpu-h100-01", be.node("gpu-h100-01").gpus[3].uuid, {"7g.80gb": 1})
    be.set_mig_layout("gpu-a100-01", be.node("gpu-a100-01").gpus[0].uuid, {"7g.80gb": 1})  # a 1-1 tie
    res = export_hcl(be.inventory())
    pools = _blocks(hcl2.loads(res.text), "pool")
    assert pools["h100_80gb_balanced_gpus_0_1_2"]["gpus"] == [0, 1, 2]
    assert pools["a100_80gb_all_7g_gpus_0"]["gpus"] == [0]  # the group holding the lowest index
    assert "gpu-h100-01: GPU 3 (NVIDIA H100 80GB HBM3 MIG 1x7g.80gb) in no pool" in res.text
    assert set(res.assignments) == {n.hostname for n in be.inventory()}
    spec_file = tmp_path / "fleet.hcl"
    spec_file.write_text(res.text)
    spec = load_spec(spec_file, env={})
    p = plan(spec, be.inventory(), None)
    assert not [d for d in p.diagnostics if d.severity == "error"]
    assert all(c.action.name == "NOOP" or c.type in ("pool", "node") for c in p.changes), \
        [(c.type, c.name, c.action) for c in p.changes]
    assert not any(c.disruptive for c in p.changes)


def test_hcl_long_node_lists_wrap_and_still_parse(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_json_atomic(path, build_fleet("12x1xH100-80GB"))
    res = export_hcl(SimulatedBackend(path).inventory())
    assert '  nodes     = [\n    "gpu-h100-01",\n' in res.text
    pool = _blocks(hcl2.loads(res.text), "pool")["h100_80gb"]
    assert len(pool["nodes"]) == 12


def test_hcl_notes_pending_and_cordoned(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_json_atomic(path, build_fleet("1x1xA100-40GB"))
    be = SimulatedBackend(path)
    g = be.node("gpu-a100-01").gpus[0]
    be.inject_fault(g.uuid, "reset_required")
    with pytest.raises(BackendError):
        be.set_mig_mode("gpu-a100-01", g.uuid, True)
    be.cordon("gpu-a100-01", True)
    text = export_hcl(be.inventory()).text
    assert "# gpu-a100-01: a MIG mode change is pending a GPU reset" in text
    assert "# gpu-a100-01: cordoned at export" in text
    assert 'mig       = "disabled"' in text  # current mode is what is exported
    hcl2.loads(text)


def _expand(entries: list[dict[str, Any]], node: NodeInfo, model: str) -> dict[int, tuple[bool, dict[str, int]]]:
    """What mig-parted would apply to each GPU of ``node`` (first matching entry wins per GPU)."""
    out: dict[int, tuple[bool, dict[str, int]]] = {}
    for e in entries:
        assert set(e) <= {"devices", "device-filter", "mig-enabled", "mig-devices"}
        if "device-filter" in e and not set(e["device-filter"]) & set(PCI_IDS.get(model, ())):
            continue
        assert ("mig-devices" in e) == e["mig-enabled"]  # required when enabled, forbidden when disabled
        idx = [g.index for g in node.gpus] if e["devices"] == "all" else e["devices"]
        for i in idx:
            out.setdefault(i, (e["mig-enabled"], dict(e.get("mig-devices", {}))))
    return out


def test_mig_parted_round_trip(nodes: list[NodeInfo]) -> None:
    res = export_mig_parted(nodes)
    cfg = yaml.safe_load(res.text)
    assert set(cfg) == {"version", "mig-configs"} and cfg["version"] == "v1"
    configs = cfg["mig-configs"]
    for node in nodes:
        label = res.assignments[node.hostname]
        model = node.gpus[0].model
        applied = _expand(configs[label], node, model)
        assert set(applied) == {g.index for g in node.gpus}
        for g in node.gpus:
            assert applied[g.index] == (g.mig_current, g.layout_counts() if g.mig_current else {})
    assert res.assignments["gpu-h100-01"] == res.assignments["gpu-a100-01"] == "all-balanced"
    assert res.assignments["gpu-h100-03"] == res.assignments["gpu-a100-03"] == "all-1g.10gb"
    assert res.assignments["gpu-v100-01"] == "all-disabled"
    assert res.assignments["gpu-a100-02"].startswith("custom-")
    # all-balanced differs per model, so each entry carries a device-filter.
    assert all("device-filter" in e for e in configs["all-balanced"])
    assert all("device-filter" not in e for e in configs["all-1g.10gb"])
    assert "#   gpu-h100-01: all-balanced" in res.text


def test_mig_parted_heterogeneous_node_lists_indices(nodes: list[NodeInfo]) -> None:
    res = export_mig_parted(nodes)
    entries = yaml.safe_load(res.text)["mig-configs"][res.assignments["gpu-a100-02"]]
    assert entries == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
    ]


def test_mig_parted_label_without_pci_ids_is_split() -> None:
    def node(host: str, name: str, model: str, profiles: list[str]) -> NodeInfo:
        devs = tuple(MigDevice(p, f"MIG-{host}-{i}", i) for i, p in enumerate(profiles))
        return NodeInfo(host, (GpuInfo(0, f"GPU-{host}", name, model, 80, True, True, devs),))

    nodes = [node("a", "NVIDIA H800", "H800-80GB", ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
             node("b", "NVIDIA A100-SXM4-40GB", "A100-40GB", ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"])]
    res = export_mig_parted(nodes)
    cfg = yaml.safe_load(res.text)["mig-configs"]
    assert res.assignments == {"a": "all-balanced-h800-80gb", "b": "all-balanced"}
    assert cfg["all-balanced-h800-80gb"][0]["mig-devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert cfg["all-balanced"][0]["device-filter"] == list(PCI_IDS["A100-40GB"])


def test_export_fleet_dispatch(nodes: list[NodeInfo]) -> None:
    assert export_fleet(nodes, "hcl").text.startswith("# Exported by rlsched")
    with pytest.raises(BackendError, match="unknown export format 'toml'"):
        export_fleet(nodes, "toml")
