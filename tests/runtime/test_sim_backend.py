"""SimulatedBackend: plan -> apply -> plan round trips and NVML/mig-parted-faithful errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlsched.cluster.catalog import CATALOG
from rlsched.cluster.feasibility import named_layouts, pack_layout
from rlsched.runtime.backend import BackendError, GpuBackend, GpuInUseError, ResetRequiredError
from rlsched.runtime.select import get_backend
from rlsched.runtime.sim_backend import (
    SimulatedBackend,
    build_fleet,
    mig_uuid_for,
    parse_node_groups,
    read_fleet,
    write_json_atomic,
)

BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


def _gpu(be: SimulatedBackend, host: str, index: int = 0):
    return be.node(host).gpus[index]


def test_is_a_gpu_backend(fleet: Path) -> None:
    be: GpuBackend = SimulatedBackend(fleet)
    assert be.name == f"sim:{fleet}"


def test_init_fleet_shape(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    nodes = be.inventory()
    assert [n.hostname for n in nodes] == ["gpu-h100-01", "gpu-h100-02", "gpu-a100-01", "gpu-v100-01"]
    h = nodes[0].gpus[0]
    assert (h.name, h.model, h.memory_mib) == ("NVIDIA H100 80GB HBM3", "H100-80GB", 81559)
    assert h.mig_current and h.mig_pending and h.layout_counts() == BALANCED
    assert all(d.uuid.startswith("MIG-") for d in h.mig_devices)
    placed = pack_layout(CATALOG["H100-80GB"], ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
    assert placed is not None
    assert sorted((d.profile, d.start) for d in h.mig_devices) == sorted((p.name, s) for p, s in placed)
    a = nodes[2].gpus[1]
    assert (a.name, a.memory_mib, a.mig_current, a.mig_devices) == ("NVIDIA A100-SXM4-40GB", 40960, False, ())
    assert len({g.uuid for n in nodes for g in n.gpus}) == 12
    # Deterministic: the same spec gives the same file.
    assert build_fleet("2x4xH100-80GB:balanced,1x2xA100-40GB,1x2xV100-16GB") == read_fleet(fleet)


def test_plan_apply_plan_round_trip_through_the_file(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    before = be.node("gpu-h100-01")
    uuid = before.gpus[0].uuid
    info = be.set_mig_layout("gpu-h100-01", uuid, {"1g.10gb": 7})
    assert info.layout_counts() == {"1g.10gb": 7}
    # A fresh backend object (another process) sees the change; the fingerprint moved.
    after = SimulatedBackend(fleet).node("gpu-h100-01")
    assert after.gpus[0].layout_counts() == {"1g.10gb": 7}
    assert after.gpus[1].layout_counts() == BALANCED
    assert after.fingerprint() != before.fingerprint()
    assert sorted(d.start for d in after.gpus[0].mig_devices) == list(range(7))
    # Fresh, deterministic MIG UUIDs per generation.
    assert {d.uuid for d in after.gpus[0].mig_devices}.isdisjoint({d.uuid for d in before.gpus[0].mig_devices})
    assert after.gpus[0].mig_devices[0].uuid == mig_uuid_for(uuid, 2, 0)
    # Re-applying the same layout still recreates (all-or-nothing), with new UUIDs.
    again = be.set_mig_layout("gpu-h100-01", uuid, {"1g.10gb": 7})
    assert again.layout_counts() == {"1g.10gb": 7}
    assert again.mig_devices[0].uuid != after.gpus[0].mig_devices[0].uuid


@pytest.mark.parametrize("layout", sorted(named_layouts(CATALOG["H100-80GB"])))
def test_every_named_layout_applies(fleet: Path, layout: str) -> None:
    be = SimulatedBackend(fleet)
    uuid = _gpu(be, "gpu-h100-02", 3).uuid
    names = named_layouts(CATALOG["H100-80GB"])[layout]
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    assert be.set_mig_layout("gpu-h100-02", uuid, counts).layout_counts() == counts


def test_layout_that_does_not_fit_is_refused_and_changes_nothing(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    g = _gpu(be, "gpu-h100-01")
    text = fleet.read_text()
    with pytest.raises(BackendError, match=r"gpu-h100-01/0.*does not fit one NVIDIA H100 80GB HBM3 \(H100-80GB\)"):
        be.set_mig_layout("gpu-h100-01", g.uuid, {"1g.10gb": 8})
    with pytest.raises(BackendError, match="does not fit"):
        be.set_mig_layout("gpu-h100-01", g.uuid, {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1})
    with pytest.raises(BackendError, match=r"MIG profile '1g\.5gb' does not exist on H100-80GB"):
        be.set_mig_layout("gpu-h100-01", g.uuid, {"1g.5gb": 1})
    with pytest.raises(BackendError, match="integer >= 0"):
        be.set_mig_layout("gpu-h100-01", g.uuid, {"1g.10gb": -1})
    assert json.loads(fleet.read_text()) == json.loads(text)


def test_layout_needs_mig_enabled_and_a_mig_model(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    a = _gpu(be, "gpu-a100-01")
    with pytest.raises(BackendError, match="MIG mode is disabled"):
        be.set_mig_layout("gpu-a100-01", a.uuid, {"7g.40gb": 1})
    v = _gpu(be, "gpu-v100-01")
    with pytest.raises(BackendError, match="MIG is not supported"):
        be.set_mig_layout("gpu-v100-01", v.uuid, {"1g.10gb": 1})
    with pytest.raises(BackendError, match="MIG is not supported"):
        be.set_mig_mode("gpu-v100-01", v.uuid, True)


def test_enable_mig_on_idle_gpu_resets_immediately(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    a = _gpu(be, "gpu-a100-01")
    be.set_mig_mode("gpu-a100-01", a.uuid, True)
    g = _gpu(be, "gpu-a100-01")
    assert (g.mig_current, g.mig_pending, g.mig_devices) == (True, True, ())
    info = be.set_mig_layout("gpu-a100-01", a.uuid, {"3g.20gb": 2})
    assert info.layout_counts() == {"3g.20gb": 2}
    be.set_mig_mode("gpu-a100-01", a.uuid, True)  # idempotent: nothing changes
    assert _gpu(be, "gpu-a100-01").layout_counts() == {"3g.20gb": 2}
    be.set_mig_mode("gpu-a100-01", a.uuid, False)  # disabling drops every instance
    g = _gpu(be, "gpu-a100-01")
    assert (g.mig_current, g.mig_pending, g.mig_devices) == (False, False, ())


def test_enable_mig_with_processes_stays_pending(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    a = _gpu(be, "gpu-a100-01")
    be.set_processes("gpu-a100-01", a.uuid, 2)
    assert be.running_jobs("gpu-a100-01") == 2
    with pytest.raises(GpuInUseError, match="pending enable"):
        be.set_mig_mode("gpu-a100-01", a.uuid, True)
    g = _gpu(be, "gpu-a100-01")
    assert (g.mig_current, g.mig_pending) == (False, True)  # observable in refresh
    with pytest.raises(BackendError, match="pending a GPU reset"):
        be.set_mig_layout("gpu-a100-01", a.uuid, {"7g.40gb": 1})
    with pytest.raises(GpuInUseError):
        be.reset_gpu("gpu-a100-01", a.uuid)
    be.set_processes("gpu-a100-01", a.uuid, 0)
    be.set_mig_mode("gpu-a100-01", a.uuid, True)  # idle now: the reset goes through
    g = _gpu(be, "gpu-a100-01")
    assert (g.mig_current, g.mig_pending) == (True, True)


def test_reset_gpu_completes_a_pending_mode(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    a = _gpu(be, "gpu-a100-01")
    be.set_processes("gpu-a100-01", a.uuid, 1)
    with pytest.raises(GpuInUseError):
        be.set_mig_mode("gpu-a100-01", a.uuid, True)
    be.set_processes("gpu-a100-01", a.uuid, 0)
    be.reset_gpu("gpu-a100-01", a.uuid)
    assert _gpu(be, "gpu-a100-01").mig_current


def test_layout_change_with_processes_is_refused_untouched(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    g = _gpu(be, "gpu-h100-01")
    be.set_processes("gpu-h100-01", g.uuid, 1)
    with pytest.raises(GpuInUseError, match="drain it first"):
        be.set_mig_layout("gpu-h100-01", g.uuid, {"7g.80gb": 1})
    assert _gpu(be, "gpu-h100-01").mig_devices == g.mig_devices


def test_unreachable_node_fails_every_call_but_shows_in_inventory(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    uuid = _gpu(be, "gpu-h100-02").uuid
    be.set_reachable("gpu-h100-02", False)
    inv = {n.hostname: n for n in be.inventory()}
    assert not inv["gpu-h100-02"].reachable and inv["gpu-h100-02"].gpus == ()
    calls = [
        lambda: be.node("gpu-h100-02"),
        lambda: be.cordon("gpu-h100-02", True),
        lambda: be.running_jobs("gpu-h100-02"),
        lambda: be.set_mig_mode("gpu-h100-02", uuid, False),
        lambda: be.set_mig_layout("gpu-h100-02", uuid, BALANCED),
    ]
    for call in calls:
        with pytest.raises(BackendError, match="gpu-h100-02 is unreachable"):
            call()
    be.set_reachable("gpu-h100-02", True)
    assert be.node("gpu-h100-02").gpus[0].uuid == uuid


def test_unknown_node_and_gpu(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    with pytest.raises(BackendError, match="did you mean gpu-h100-01"):
        be.node("gpu-h100-1")
    with pytest.raises(BackendError, match="no GPU with UUID GPU-nope"):
        be.set_mig_mode("gpu-h100-01", "GPU-nope", True)


def test_cordon_round_trip(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    be.cordon("gpu-h100-01", True)
    assert SimulatedBackend(fleet).node("gpu-h100-01").cordoned
    be.cordon("gpu-h100-01", False)
    assert not be.node("gpu-h100-01").cordoned


def test_fault_fail_set_layout_is_consumed_and_leaves_no_devices(fleet: Path) -> None:
    data = read_fleet(fleet)
    data["faults"] = {"gpu-h100-02": "fail_set_layout"}
    write_json_atomic(fleet, data)
    be = SimulatedBackend(fleet)
    uuid = _gpu(be, "gpu-h100-02").uuid
    with pytest.raises(BackendError, match=r"injected fault fail_set_layout.*no MIG devices"):
        be.set_mig_layout("gpu-h100-02", uuid, {"7g.80gb": 1})
    assert _gpu(be, "gpu-h100-02").mig_devices == ()
    assert "faults" not in read_fleet(fleet)
    assert be.set_mig_layout("gpu-h100-02", uuid, {"7g.80gb": 1}).layout_counts() == {"7g.80gb": 1}


def test_fault_queue_by_gpu_uuid(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    a = _gpu(be, "gpu-a100-01")
    be.inject_fault(a.uuid, "reset_required")
    be.inject_fault(a.uuid, "fail_set_mode")
    with pytest.raises(BackendError, match="fail_set_mode"):
        be.set_mig_mode("gpu-a100-01", a.uuid, True)
    assert not _gpu(be, "gpu-a100-01").mig_pending  # failed before touching the GPU
    with pytest.raises(ResetRequiredError, match="pending enable state until the GPU is reset"):
        be.set_mig_mode("gpu-a100-01", a.uuid, True)
    g = _gpu(be, "gpu-a100-01")
    assert (g.mig_current, g.mig_pending) == (False, True)
    be.set_mig_mode("gpu-a100-01", a.uuid, True)
    assert _gpu(be, "gpu-a100-01").mig_current
    be.inject_fault("gpu-a100-01", "fail_cordon")
    with pytest.raises(BackendError, match="fail_cordon"):
        be.cordon("gpu-a100-01", True)
    be.cordon("gpu-a100-01", True)
    with pytest.raises(BackendError, match="unknown fault"):
        be.inject_fault("gpu-a100-01", "explode")


def test_in_use_fault(fleet: Path) -> None:
    be = SimulatedBackend(fleet)
    g = _gpu(be, "gpu-h100-01")
    be.inject_fault("gpu-h100-01", "in_use")
    with pytest.raises(GpuInUseError):
        be.set_mig_layout("gpu-h100-01", g.uuid, {"7g.80gb": 1})
    assert be.set_mig_layout("gpu-h100-01", g.uuid, {"7g.80gb": 1}).layout_counts() == {"7g.80gb": 1}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=2), "unsupported fleet version 2"),
        (lambda d: d.update(nodez=[]), "unknown field 'nodez'; did you mean 'nodes'"),
        (lambda d: d["nodes"][0]["gpus"][0].update(mig_curent=True), "did you mean 'mig_current'"),
        (lambda d: d["nodes"][0]["gpus"][0].pop("uuid"), "missing required field 'uuid'"),
        (lambda d: d["nodes"][1].update(hostname="gpu-h100-01"), "hostname appears twice"),
        (lambda d: d["nodes"][0]["gpus"][0].update(processes="2"), "'processes' has the wrong type"),
        (lambda d: d.update(faults={"gpu-h100-01": "fail_set_layuot"}), "did you mean 'fail_set_layout'"),
    ],
)
def test_fleet_schema_is_strict(fleet: Path, mutate, message: str) -> None:
    data = read_fleet(fleet)
    mutate(data)
    fleet.write_text(json.dumps(data))
    with pytest.raises(BackendError, match=message):
        SimulatedBackend(fleet)


def test_bad_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "nodes": [}')
    with pytest.raises(BackendError, match=r"bad\.json:1:\d+: not valid JSON"):
        SimulatedBackend(bad)
    with pytest.raises(BackendError, match="rlsched inventory init"):
        SimulatedBackend(tmp_path / "missing.json")


def test_parse_node_groups() -> None:
    groups = parse_node_groups("4x8xH100-80GB, 2x8xa100-80gb:1g.10gb,3g.40gb,1x1xH200")
    assert [(g.nodes, g.gpus_per_node, g.model, g.mig) for g in groups] == [
        (4, 8, "H100-80GB", None), (2, 8, "A100-80GB", "1g.10gb,3g.40gb"), (1, 1, "H200-141GB", None)]
    with pytest.raises(BackendError, match="expected NODESxGPUSxMODEL"):
        parse_node_groups("4xH100")
    with pytest.raises(Exception, match="unknown GPU model"):
        parse_node_groups("1x8xH1000")


def test_build_fleet_mig_options() -> None:
    data = build_fleet("1x1xH100-80GB,1x1xA100-40GB:all-7g,1x1xT4", mig="all-1g", hostname_prefix="n")
    hosts = {n["hostname"]: n["gpus"][0] for n in data["nodes"]}
    assert set(hosts) == {"n-h100-01", "n-a100-01", "n-t4-01"}
    assert [d["profile"] for d in hosts["n-h100-01"]["mig_devices"]] == ["1g.10gb"] * 7
    assert [d["profile"] for d in hosts["n-a100-01"]["mig_devices"]] == ["7g.40gb"]
    assert not hosts["n-t4-01"]["mig_current"]  # the default --mig skips models without MIG
    with pytest.raises(BackendError, match="T4 does not support MIG"):
        build_fleet("1x1xT4:all-1g")
    with pytest.raises(BackendError, match="does not fit"):
        build_fleet("1x1xH100-80GB", mig="4g.40gb+4g.40gb")
    # hostnames keep counting across groups of one family
    data = build_fleet("1x1xA100-40GB,1x1xA100-80GB")
    assert [n["hostname"] for n in data["nodes"]] == ["gpu-a100-01", "gpu-a100-02"]


def test_get_backend(fleet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(get_backend(f"sim:{fleet}"), SimulatedBackend)
    monkeypatch.setenv("RLSCHED_BACKEND", f"sim:{fleet}")
    assert get_backend(None).name == f"sim:{fleet}"
    monkeypatch.delenv("RLSCHED_BACKEND")
    with pytest.raises(BackendError, match="pass --backend or set RLSCHED_BACKEND"):
        get_backend(None)
    with pytest.raises(BackendError, match=r"did you mean 'sim:fleet\.json'"):
        get_backend("fleet.json")
    with pytest.raises(BackendError, match="unknown backend 'k8s'"):
        get_backend("k8s")
    with pytest.raises(BackendError, match="needs a fleet file path"):
        get_backend("sim:")
