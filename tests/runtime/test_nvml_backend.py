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
    with pytest.raises(AttributeError, match=r"does not model pynvml\.nvmlDeviceGetPowerUsage"):
        fake.nvmlDeviceGetPowerUsage  # noqa: B018
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
