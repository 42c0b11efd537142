"""NvmlBackend's own code driven through the faithful fake pynvml (no GPU needed)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pynvml
import pytest

from rlsched.runtime.backend import BackendError, GpuBackend, GpuInUseError, ResetRequiredError
from rlsched.runtime.nvml_backend import NvmlBackend, marketing_name, model_from_nvml_name

from .fake_pynvml import FakeGpu, FakeNvml, geometry

HOST = "node-a"


def backend(*gpus: FakeGpu, **kw: bool) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml(list(gpus), **kw)
    return NvmlBackend(nvml=fake, hostname=HOST), fake


def uuid(be: NvmlBackend, index: int) -> str:
    return be.node(HOST).gpus[index].uuid


# --- the fake is faithful to the installed pynvml ----------------------------------------


def test_fake_functions_exist_in_pynvml_with_the_same_parameters() -> None:
    names = [n for n in vars(FakeNvml) if n.startswith("nvml")]
    assert len(names) > 25
    for name in names:
        real = getattr(pynvml, name)
        want = [p for p in inspect.signature(inspect.unwrap(real)).parameters]
        got = [p for p in inspect.signature(getattr(FakeNvml, name)).parameters][1:]  # drop self
        assert got == want, f"{name}: fake {got} != pynvml {want}"


def test_fake_uses_real_error_classes_and_structs() -> None:
    fake = FakeNvml([FakeGpu("H100-80GB")])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert fake.nvmlDeviceGetMigMode(h) == [0, 0]
    info = fake.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    # _PrintableStructure decodes char arrays, so the name is a str, as on real hardware.
    assert (info.id, info.sliceCount, info.instanceCount, info.name) == (9, 3, 2, "MIG 3g.40gb")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)
    with pytest.raises(AttributeError, match=r"does not model pynvml\.nvmlDeviceGetClockInfo"):
        fake.nvmlDeviceGetClockInfo  # noqa: B018
    assert fake.NVML_ERROR_IN_USE == pynvml.NVML_ERROR_IN_USE == 19
    with pytest.raises(pynvml.NVMLError) as exc:
        fake.nvmlDeviceGetHandleByIndex(5)
    assert exc.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


@pytest.mark.parametrize("model", ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"])
def test_fake_geometry_matches_prior_art_and_the_catalogue(model: str) -> None:
    from rlsched.cluster.catalog import CATALOG

    fake = {p.name: (p.slices, p.mem_slices, p.max_count, p.starts) for p in geometry(model).values()}
    cat = {p.name: (p.compute_slices, p.memory_slices, p.max_count, p.starts) for p in CATALOG[model].mig_profiles}
    assert fake == cat


# --- library availability -------------------------------------------------------------------


def test_driver_not_loaded_and_library_missing_are_clear() -> None:
    with pytest.raises(BackendError, match=r"^NVML not available: Driver Not Loaded"):
        NvmlBackend(nvml=FakeNvml([], driver_loaded=False))
    with pytest.raises(BackendError, match=r"^NVML not available: NVML Shared Library Not Found"):
        NvmlBackend(nvml=FakeNvml([], library_found=False))


def test_uninitialised_library_is_not_available() -> None:
    be, fake = backend(FakeGpu())
    be.close()
    assert fake.refcount == 0
    with pytest.raises(BackendError, match="NVML not available"):
        be.inventory()


def test_real_pynvml_without_a_driver_is_a_clear_error_or_works() -> None:
    try:
        be = NvmlBackend()
    except BackendError as exc:
        assert str(exc).startswith("NVML not available:")
    else:  # a machine with an NVIDIA driver
        be.close()


def test_importing_the_backends_does_not_import_pynvml() -> None:
    code = ("import sys, rlsched.runtime.nvml_backend, rlsched.runtime.select, rlsched.runtime.sim_backend, "
            "rlsched.runtime.export, rlsched.cli.backend_cmd; assert 'pynvml' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


# --- inventory ----------------------------------------------------------------------------


def test_inventory_shapes() -> None:
    be, _ = backend(FakeGpu("H100-80GB"), FakeGpu("A100-40GB", mig_current=True, processes=2), FakeGpu("V100-16GB"))
    proto: GpuBackend = be
    (node,) = proto.inventory()
    assert node.hostname == HOST and node.reachable and not node.cordoned
    h, a, v = node.gpus
    assert (h.index, h.name, h.model, h.memory_mib) == (0, "NVIDIA H100 80GB HBM3", "H100-80GB", 81559)
    assert h.uuid.startswith("GPU-") and (h.mig_current, h.mig_pending) == (False, False)
    assert (a.model, a.memory_mib, a.mig_current, a.processes, a.mig_devices) == ("A100-40GB", 40960, True, 2, ())
    assert (v.model, v.mig_current, v.mig_pending) == ("V100-16GB", False, False)
    assert be.running_jobs(HOST) == 2
    with pytest.raises(BackendError, match="only manages the local node node-a"):
        be.node("other")


def test_lost_gpu_is_unhealthy_not_fatal() -> None:
    be, fake = backend(FakeGpu(), FakeGpu())
    uuid0 = uuid(be, 0)
    fake.gpus[1].lost = True
    g0, g1 = be.node(HOST).gpus
    assert g0.uuid == uuid0 and g0.healthy
    assert (g1.index, g1.uuid, g1.healthy) == (1, "", False)
    fake.gpus[1].lost = False
    assert be.node(HOST).gpus[1].healthy


# --- MIG mode -----------------------------------------------------------------------------


def test_enable_on_idle_gpu() -> None:
    be, fake = backend(FakeGpu("H100-80GB"))
    be.set_mig_mode(HOST, uuid(be, 0), True)
    g = be.node(HOST).gpus[0]
    assert (g.mig_current, g.mig_pending, g.mig_devices) == (True, True, ())
    be.set_mig_mode(HOST, g.uuid, True)  # no-op
    be.set_mig_layout(HOST, g.uuid, {"3g.40gb": 2})
    be.set_mig_mode(HOST, g.uuid, False)  # destroys instances first, then disables
    g = be.node(HOST).gpus[0]
    assert (g.mig_current, g.mig_pending, fake.gpus[0].gis) == (False, False, {})


def test_enable_with_processes_stays_pending_and_raises_in_use() -> None:
    be, fake = backend(FakeGpu("A100-40GB", processes=1))
    with pytest.raises(GpuInUseError, match="pending enable state"):
        be.set_mig_mode(HOST, uuid(be, 0), True)
    g = be.node(HOST).gpus[0]
    assert (g.mig_current, g.mig_pending) == (False, True)
    with pytest.raises(BackendError, match="enable is pending a GPU reset"):
        be.set_mig_layout(HOST, g.uuid, {"7g.40gb": 1})
    fake.gpus[0].processes = 0
    be.set_mig_mode(HOST, g.uuid, True)
    assert be.node(HOST).gpus[0].mig_current


def test_reset_required() -> None:
    be, _ = backend(FakeGpu("H100-80GB", reset_supported=False))
    with pytest.raises(ResetRequiredError, match=r"nvidia-smi -r -i 0"):
        be.set_mig_mode(HOST, uuid(be, 0), True)
    g = be.node(HOST).gpus[0]
    assert (g.mig_current, g.mig_pending) == (False, True)


def test_disable_with_processes_is_in_use() -> None:
    be, fake = backend(FakeGpu("H100-80GB", mig_current=True))
    be.set_mig_layout(HOST, uuid(be, 0), {"7g.80gb": 1})
    fake.gpus[0].processes = 1
    with pytest.raises(GpuInUseError, match="NVML_ERROR_IN_USE"):
        be.set_mig_mode(HOST, uuid(be, 0), False)
    assert fake.layout(0) == {"7g.80gb": 1}


def test_unsupported_gpu() -> None:
    be, _ = backend(FakeGpu("V100-16GB"))
    with pytest.raises(BackendError, match=r"GPU node-a/0 .*Tesla V100-SXM2-16GB.*MIG is not supported"):
        be.set_mig_mode(HOST, uuid(be, 0), True)
    with pytest.raises(BackendError, match="MIG is not supported"):
        be.set_mig_layout(HOST, uuid(be, 0), {"1g.10gb": 1})
    with pytest.raises(BackendError, match="no GPU with UUID GPU-x"):
        be.set_mig_mode(HOST, "GPU-x", True)


# --- MIG layouts ----------------------------------------------------------------------------


def _all_profile_layouts(model: str) -> list[dict[str, int]]:
    return [{p.name: p.max_count} for p in sorted(geometry(model).values(), key=lambda p: p.id)]


@pytest.mark.parametrize(
    ("model", "layout"),
    [(m, lay) for m in ("H100-80GB", "A100-40GB", "H200-141GB") for lay in _all_profile_layouts(m)],
    ids=lambda x: x if isinstance(x, str) else "+".join(f"{c}x{p}" for p, c in x.items()),
)
def test_every_all_profile_layout(model: str, layout: dict[str, int]) -> None:
    be, fake = backend(FakeGpu(model, mig_current=True))
    g = be.node(HOST).gpus[0]
    info = be.set_mig_layout(HOST, g.uuid, layout)
    assert info.layout_counts() == layout
    assert fake.layout(0) == layout
    assert len({d.uuid for d in info.mig_devices}) == sum(layout.values())
    assert all(d.uuid.startswith("MIG-") for d in info.mig_devices)
    assert be.node(HOST).gpus[0] == info  # a fresh refresh reads the same


@pytest.mark.parametrize("layout", [
    {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    {"4g.40gb": 1, "3g.40gb": 1},
    {"1g.20gb": 2, "3g.40gb": 1},
    {"1g.10gb+me": 1, "1g.10gb": 6},
    {"2g.20gb": 3, "1g.10gb": 1},
])
def test_mixed_layouts_and_replacement(layout: dict[str, int]) -> None:
    be, fake = backend(FakeGpu("H100-80GB", mig_current=True))
    u = uuid(be, 0)
    first = be.set_mig_layout(HOST, u, {"1g.10gb": 7})
    info = be.set_mig_layout(HOST, u, layout)
    assert info.layout_counts() == layout and fake.layout(0) == layout
    assert not {d.uuid for d in first.mig_devices} & {d.uuid for d in info.mig_devices}
    assert sorted((d.profile, d.start) for d in info.mig_devices) == fake.placements(0)


def test_layout_that_does_not_fit_names_gpu_and_model() -> None:
    be, fake = backend(FakeGpu("H100-80GB", mig_current=True))
    u = uuid(be, 0)
    be.set_mig_layout(HOST, u, {"7g.80gb": 1})
    with pytest.raises(BackendError, match=r"node-a/0.*does not fit one NVIDIA H100 80GB HBM3 \(H100-80GB\)"):
        be.set_mig_layout(HOST, u, {"1g.10gb": 8})
    with pytest.raises(BackendError, match=r"MIG profile '1g\.5gb' does not exist on H100-80GB"):
        be.set_mig_layout(HOST, u, {"1g.5gb": 1})
    assert fake.layout(0) == {"7g.80gb": 1}  # refused before touching the GPU


def test_layout_needs_mig_on() -> None:
    be, _ = backend(FakeGpu("A100-40GB"))
    with pytest.raises(BackendError, match="MIG mode is disabled"):
        be.set_mig_layout(HOST, uuid(be, 0), {"7g.40gb": 1})


def test_layout_with_processes_is_in_use_and_untouched() -> None:
    be, fake = backend(FakeGpu("H100-80GB", mig_current=True))
    u = uuid(be, 0)
    be.set_mig_layout(HOST, u, {"3g.40gb": 2})
    fake.gpus[0].processes = 1
    with pytest.raises(GpuInUseError):
        be.set_mig_layout(HOST, u, {"7g.80gb": 1})
    assert fake.layout(0) == {"3g.40gb": 2}


def test_failure_midway_leaves_no_mig_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    be, fake = backend(FakeGpu("H100-80GB", mig_current=True))
    u = uuid(be, 0)
    calls = {"n": 0}
    real = fake.nvmlGpuInstanceCreateComputeInstance

    def flaky(gi, profile_id):
        calls["n"] += 1
        if calls["n"] == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return real(gi, profile_id)

    monkeypatch.setattr(fake, "nvmlGpuInstanceCreateComputeInstance", flaky)
    with pytest.raises(BackendError, match=r"creating .* at slice \d.*left with no MIG devices"):
        be.set_mig_layout(HOST, u, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    assert fake.gpus[0].gis == {}
    assert be.node(HOST).gpus[0].mig_devices == ()


def test_old_driver_without_named_profile_info() -> None:
    be, _ = backend(FakeGpu("A100-40GB", mig_current=True), profile_info_v2=False)
    info = be.set_mig_layout(HOST, uuid(be, 0), {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})
    assert info.layout_counts() == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


def test_instances_created_outside_rlsched_are_reported_and_replaced() -> None:
    be, fake = backend(FakeGpu("H100-80GB", mig_current=True))
    fake_h = fake.nvmlDeviceGetHandleByIndex(0)
    gi = fake.nvmlDeviceCreateGpuInstance(fake_h, 9)  # 3g.40gb, first fit
    fake.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    fake.nvmlDeviceCreateGpuInstance(fake_h, 14)  # a 2g GI without compute instance: no MIG device
    g = be.node(HOST).gpus[0]
    assert g.layout_counts() == {"3g.40gb": 1}
    info = be.set_mig_layout(HOST, g.uuid, {"7g.80gb": 1})  # clears both first
    assert info.layout_counts() == {"7g.80gb": 1} and fake.placements(0) == [("7g.80gb", 0)]


def test_cordon_is_local_state() -> None:
    be, _ = backend(FakeGpu())
    be.cordon(HOST, True)
    assert be.node(HOST).cordoned
    be.cordon(HOST, False)
    assert not be.inventory()[0].cordoned


def test_marketing_names() -> None:
    for model in ("H100-80GB", "A100-80GB", "A100-40GB", "H200-141GB"):
        assert model_from_nvml_name(marketing_name(model)) == model
    assert marketing_name("H100-80GB") == "NVIDIA H100 80GB HBM3"
    assert marketing_name("A100-80GB") == "NVIDIA A100-SXM4-80GB"
    assert marketing_name("H200-141GB") == "NVIDIA H200"
    assert model_from_nvml_name("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    assert model_from_nvml_name("Some Future GPU") == ""


@pytest.mark.gpu
def test_real_nvml_inventory_is_read_only_and_well_formed() -> None:
    """Smoke test on a machine with an NVIDIA driver; reads only, never changes MIG."""
    try:
        be = NvmlBackend()
    except BackendError as exc:
        pytest.skip(str(exc))
    with be:
        (node,) = be.inventory()
        assert node.gpus, "NVML reports no GPU"
        for g in node.gpus:
            assert g.uuid.startswith("GPU-") and g.memory_mib > 0 and g.name
            for d in g.mig_devices:
                assert d.uuid.startswith("MIG-") and "g." in d.profile


# --- telemetry ----------------------------------------------------------------------------


def test_fake_telemetry_and_event_shapes_are_the_real_ones() -> None:
    fake = FakeNvml([FakeGpu("H100-80GB", utilization=40, processes=1)])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    util = fake.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t) and (util.gpu, util.memory) == (40, 20)
    assert fake.nvmlDeviceGetPowerUsage(h) == 70_000  # milliwatts
    assert fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 35
    assert fake.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 0
    (proc,) = fake.nvmlDeviceGetComputeRunningProcesses(h)
    assert (proc.pid, proc.usedGpuMemory) == (1000, 1 << 30)
    es = fake.nvmlEventSetCreate()
    assert isinstance(es, pynvml.c_nvmlEventSet_t)
    fake.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError_Timeout) as exc:
        fake.nvmlEventSetWait_v2(es, 0)
    assert exc.value.value == pynvml.NVML_ERROR_TIMEOUT == 10
    fake.inject_xid(0, 79)
    fake.inject_ecc(0)  # not registered for ECC events: counted, not delivered
    data = fake.nvmlEventSetWait_v2(es, 100)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert fake.nvmlDeviceGetUUID(data.device) == fake.gpus[0].uuid
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(es, 0)
    assert fake.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 1
    fake.gpus[0].fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(pynvml.NVMLError_Unknown):
        fake.nvmlDeviceGetPowerUsage(h)
    assert (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_IN_USE) == (3, 15, 19)


def test_telemetry_values_and_units() -> None:
    be, fake = backend(FakeGpu("H100-80GB", utilization=73, temperature=61, power_mw=312_500, processes=2),
                       FakeGpu("A100-40GB", mig_current=True), FakeGpu("T4", ecc_supported=False))
    h, a, t = be.telemetry()
    assert set(h) == {"hostname", "uuid", "index", "healthy", "utilization_gpu", "memory_used_mib", "memory_total_mib",
                      "temperature_c", "power_w", "ecc_double_bit", "processes"}
    assert h["uuid"] == fake.gpus[0].uuid and h["index"] == 0 and h["healthy"]
    assert (h["utilization_gpu"], h["temperature_c"], h["power_w"], h["ecc_double_bit"]) == (73, 61, 312.5, 0)
    assert (h["memory_used_mib"], h["memory_total_mib"]) == (2048, 81559)
    assert h["processes"] == [{"pid": 1000, "used_memory_mib": 1024}, {"pid": 1001, "used_memory_mib": 1024}]
    assert a["utilization_gpu"] is None and a["memory_total_mib"] == 40960 and "error" not in a  # MIG on
    assert t["ecc_double_bit"] is None and t["processes"] == [] and "error" not in t


def test_telemetry_process_memory_may_be_unknown() -> None:
    be, _ = backend(FakeGpu(processes=1, process_memory=None))
    assert be.telemetry()[0]["processes"] == [{"pid": 1000, "used_memory_mib": None}]


def test_telemetry_error_on_one_gpu_keeps_the_others() -> None:
    be, fake = backend(FakeGpu(), FakeGpu(), FakeGpu())
    fake.gpus[1].fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    fake.gpus[2].lost = True
    g0, g1, g2 = be.telemetry()
    assert "error" not in g0 and g0["temperature_c"] == 35
    assert g1["uuid"] == fake.gpus[1].uuid and "Unknown Error" in g1["error"] and not g1["healthy"]
    assert g1["temperature_c"] is None and g1["index"] == 1
    assert g2["index"] == 2 and "GPU is lost" in g2["error"]
    assert [g.healthy for g in be.node(HOST).gpus] == [True, True, False]


# --- health events -----------------------------------------------------------------------


def test_xid_event_marks_gpu_unhealthy_for_the_life_of_the_backend() -> None:
    be, fake = backend(FakeGpu(), FakeGpu())
    assert be.health_events() == []
    fake.inject_xid(1, 79)
    fake.inject_xid(0, 13)  # application error (graphics engine exception): not a health event
    events = be.health_events(timeout_ms=50)
    assert events == [(fake.gpus[1].uuid, "Xid 79 (critical error)")]
    assert "nvmlEventSetWait_v2(50)" in fake.calls and "nvmlEventSetWait_v2(0)" in fake.calls
    assert be.health_events() == []
    assert [g.healthy for g in be.inventory()[0].gpus] == [True, False]
    assert [g.healthy for g in be.node(HOST).gpus] == [True, False]
    assert be.telemetry()[1]["healthy"] is False
    assert be.unhealthy() == {fake.gpus[1].uuid: "Xid 79 (critical error)"}
    assert len(fake.event_sets) == 1  # registered once


def test_double_bit_ecc_event_and_counter_growth() -> None:
    be, fake = backend(FakeGpu(), FakeGpu(), FakeGpu())
    assert be.health_events() == []
    fake.inject_ecc(0)  # event and counter
    events = be.health_events()
    assert (fake.gpus[0].uuid, "double-bit ECC error") in events
    fake.inject_ecc(2, 3, event=False)  # counter only (an event lost or not supported)
    (event,) = be.health_events()
    assert event[0] == fake.gpus[2].uuid and "3 new uncorrected" in event[1]
    assert be.health_events() == []
    assert [g.healthy for g in be.node(HOST).gpus] == [False, True, False]


def test_ecc_growth_seen_by_telemetry_is_a_health_event() -> None:
    be, fake = backend(FakeGpu(), FakeGpu())
    be.telemetry()
    fake.inject_ecc(1, 2, event=False)
    t = be.telemetry()
    assert t[1]["ecc_double_bit"] == 2 and not t[1]["healthy"] and t[0]["healthy"]
    (event,) = be.health_events()
    assert event[0] == fake.gpus[1].uuid and "2 new uncorrected" in event[1]
    assert be.health_events() == []


def test_devices_without_event_support_are_skipped() -> None:
    be, fake = backend(FakeGpu(events_supported=False), FakeGpu("T4", ecc_supported=False), FakeGpu())
    assert be.health_events() == []
    assert be.events_unsupported == [0]
    fake.inject_xid(0, 79)  # not registered: never delivered
    fake.inject_xid(1, 48)
    fake.inject_xid(2, 94)
    assert be.health_events() == [(fake.gpus[1].uuid, "Xid 48 (critical error)"),
                                  (fake.gpus[2].uuid, "Xid 94 (critical error)")]


def test_close_frees_the_event_set() -> None:
    be, fake = backend(FakeGpu())
    be.health_events()
    be.close()
    assert all(es.freed for es in fake.event_sets.values()) and fake.refcount == 0


@pytest.mark.gpu
def test_real_nvml_telemetry_and_health_are_well_formed() -> None:
    try:
        be = NvmlBackend()
    except BackendError as exc:
        pytest.skip(str(exc))
    with be:
        for t in be.telemetry():
            assert "error" not in t, t
            assert t["uuid"].startswith("GPU-") and t["memory_total_mib"] > 0
        assert isinstance(be.health_events(timeout_ms=10), list)


# --- the simulated backend reports telemetry and health in the same shapes ---------------


def test_sim_backend_telemetry_and_health_events_match_nvml(tmp_path) -> None:
    from rlsched.runtime.sim_backend import SimulatedBackend, build_fleet, read_fleet, write_json_atomic

    path = tmp_path / "fleet.json"
    data = build_fleet("1x2xH100-80GB,1x1xA100-40GB:balanced")
    g0, g1 = data["nodes"][0]["gpus"]
    g0["telemetry"] = {"utilization_gpu": 40, "temperature_c": 55, "power_w": 300.5, "ecc_double_bit": 0}
    g1["xid"] = [13, 79]
    write_json_atomic(path, data)
    read_fleet(path)  # the new keys validate
    sim = SimulatedBackend(path)
    rows = sim.telemetry()
    nv_be, _ = backend(FakeGpu())
    assert set(rows[0]) == set(nv_be.telemetry()[0])
    assert (rows[0]["utilization_gpu"], rows[0]["power_w"], rows[0]["memory_total_mib"]) == (40, 300.5, 81559)
    assert rows[2]["utilization_gpu"] is None  # MIG on, as NVML
    host = data["nodes"][0]["hostname"]
    assert sim.health_events() == [(g1["uuid"], "Xid 79 (critical error)")]  # Xid 13 is an application error
    assert sim.health_events() == []
    assert [g.healthy for g in sim.node(host).gpus] == [True, False]
    sim.set_telemetry(host, g0["uuid"], ecc_double_bit=2)
    sim.inject_xid(host, g1["uuid"], 48)
    events = sim.health_events()
    assert events[0][0] == g0["uuid"] and "2 new uncorrected" in events[0][1]
    assert events[1] == (g1["uuid"], "Xid 48 (critical error)")
    assert [g.healthy for g in sim.inventory()[0].gpus] == [False, False]
    assert SimulatedBackend(path).inventory()[0].gpus[0].healthy  # per backend object; the file is unchanged


@pytest.mark.parametrize(("gpu_patch", "message"), [
    ({"telemetry": {"utilisation_gpu": 1}}, "did you mean 'utilization_gpu'"),
    ({"telemetry": {"power_w": "high"}}, "must be a number"),
    ({"telemetry": {"ecc_double_bit": 1.5}}, "integer count"),
    ({"xid": [79, "x"]}, "positive integers"),
])
def test_sim_fleet_health_fields_are_validated(tmp_path, gpu_patch, message: str) -> None:
    from rlsched.runtime.sim_backend import build_fleet, validate_fleet

    data = build_fleet("1x1xH100-80GB")
    data["nodes"][0]["gpus"][0].update(gpu_patch)
    with pytest.raises(BackendError, match=message):
        validate_fleet(data)
