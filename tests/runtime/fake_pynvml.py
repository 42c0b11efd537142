"""A faithful in-memory stand-in for the pynvml functions that NvmlBackend calls.

Faithful means: the same function names and parameters as nvidia-ml-py (a test
checks them against the installed ``pynvml``), the same return shapes (the real
ctypes structs such as ``c_nvmlGpuInstanceProfileInfo_v2_t`` and
``c_nvmlMemory_t``, ``[current, pending]`` lists, ``str`` names and UUIDs, friendly
objects for processes), handles that are real ctypes pointers (never
dereferenced), array-filling calls that write into the caller's ctypes array and
``byref`` count, and the real ``pynvml.NVMLError`` classes, so ``except
pynvml.NVMLError_InUse`` behaves exactly as on a machine with a GPU.

Every NVML constant, error class and struct type not defined here is taken from
the installed ``pynvml``; any *function* not implemented here raises
AttributeError, so the backend cannot silently call something the fake does not
model.

Geometry (PRIOR_ART.md section 7; profile ids as ``nvidia-smi mig -lgip`` shows
them): 7 compute and 8 memory slices; profile -> (id, compute slices, memory
slices, max instances, legal starts)::

    1g      (19, 1, 1, 7, 0..6)      1g+me (20, 1, 1, 1, 0..6)   1g double (15, 1, 2, 4, 0/2/4/6)
    2g      (14, 2, 2, 3, 0/2/4)     3g    (9, 3, 4, 2, 0/4)     4g (5, 4, 4, 1, 0)   7g (0, 7, 8, 1, 0)

MIG mode: ``nvmlDeviceSetMigMode`` stores the pending mode and resets the GPU
itself when it can; with processes on the GPU the activation status it returns is
``NVML_ERROR_IN_USE``, on a GPU that cannot be reset in place
(``reset_supported=False``) it is ``NVML_ERROR_RESET_REQUIRED``; in both cases the
current mode is unchanged. Destroying an instance while processes run raises
``NVMLError_InUse``.

Telemetry and health: utilisation (``NVML_ERROR_NOT_SUPPORTED`` while MIG is on, as
on real A100/H100), temperature, power in milliwatts, ECC counters (volatile and
aggregate; ``ecc_supported=False`` makes them and the ECC event types unsupported)
and event sets (``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents`` /
``nvmlEventSetWait_v2`` returning ``c_nvmlEventData_t`` or raising
``NVMLError_Timeout``). Test helpers inject faults: :meth:`FakeNvml.inject_xid`,
:meth:`FakeNvml.inject_ecc`, and ``FakeGpu.fail`` (pynvml function name -> NVML error
code raised by every call of that function on that GPU).
"""

from __future__ import annotations

import ctypes
import sys
import uuid as uuidlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

_NS = uuidlib.UUID("0b0f2d7e-6a55-4a55-8e3f-5bb1c6c7c0de")

# family memory sizes: (1g, 1g double, 2g, 3g, 4g, 7g) in GB, total MiB, SMs per slice
_FAMILIES: dict[str, tuple[tuple[int, int, int, int, int, int], int, int, str]] = {
    "A100-40GB": ((5, 10, 10, 20, 20, 40), 40960, 14, "NVIDIA A100-SXM4-40GB"),
    "A100-80GB": ((10, 20, 20, 40, 40, 80), 81920, 14, "NVIDIA A100-SXM4-80GB"),
    "H100-80GB": ((10, 20, 20, 40, 40, 80), 81559, 16, "NVIDIA H100 80GB HBM3"),
    "H200-141GB": ((18, 35, 35, 71, 71, 141), 143771, 16, "NVIDIA H200"),
}
#: Models without MIG: (total MiB, NVML name).
_PLAIN: dict[str, tuple[int, str]] = {
    "V100-16GB": (16384, "Tesla V100-SXM2-16GB"),
    "T4": (15360, "Tesla T4"),
}


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of a fake GPU."""

    enum: int
    id: int
    name: str
    slices: int
    mem_slices: int
    max_count: int
    starts: tuple[int, ...]
    memory_mb: int
    sms: int


def geometry(model: str) -> dict[int, Profile]:
    """The GPU-instance profiles of ``model`` keyed by enum (empty for non-MIG models)."""
    if model not in _FAMILIES:
        return {}
    (g1, g1d, g2, g3, g4, g7), total, sms, _ = _FAMILIES[model]
    per = total // 8
    rows = [
        ("NVML_GPU_INSTANCE_PROFILE_1_SLICE", 19, f"1g.{g1}gb", 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 20, f"1g.{g1}gb+me", 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 15, f"1g.{g1d}gb", 1, 2, 4, (0, 2, 4, 6)),
        ("NVML_GPU_INSTANCE_PROFILE_2_SLICE", 14, f"2g.{g2}gb", 2, 2, 3, (0, 2, 4)),
        ("NVML_GPU_INSTANCE_PROFILE_3_SLICE", 9, f"3g.{g3}gb", 3, 4, 2, (0, 4)),
        ("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 5, f"4g.{g4}gb", 4, 4, 1, (0,)),
        ("NVML_GPU_INSTANCE_PROFILE_7_SLICE", 0, f"7g.{g7}gb", 7, 8, 1, (0,)),
    ]
    return {
        getattr(_real, e): Profile(getattr(_real, e), pid, name, s, m, mx, st, per * m, sms * s)
        for e, pid, name, s, m, mx, st in rows
    }


#: Compute slices -> compute-instance profile enum (CI profile ids equal the enums).
_CI_SLICES: dict[int, int] = {
    _real.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    _real.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    _real.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    _real.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    _real.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}


@dataclass
class FakeCi:
    id: int
    profile_id: int  # CI profile id (== enum)
    slices: int
    start: int
    uuid: str
    handle: int = 0  # address of its compute-instance handle
    mig_handle: int = 0  # address of its MIG device handle


@dataclass
class FakeGi:
    id: int
    profile: Profile
    start: int
    cis: dict[int, FakeCi] = field(default_factory=dict)
    handle: int = 0


@dataclass
class FakeGpu:
    """One simulated GPU; configure per test.

    Attributes:
        model: a key of the geometry tables (``H100-80GB``, ``A100-40GB``, ``V100-16GB``...).
        mig_current / mig_pending: NVML's MIG modes (pending defaults to current).
        processes: compute processes running on the GPU (block resets and destroys).
        reset_supported: False models pass-through VMs where NVML cannot reset.
        lost: every per-device call raises ``NVMLError_GpuIsLost``.
        utilization / temperature / power_mw: what the sensors read.
        ecc_supported: False models a GPU without ECC (GeForce, ECC disabled).
        ecc_volatile / ecc_aggregate: uncorrected (double-bit) ECC counts.
        events_supported: False makes event registration ``NOT_SUPPORTED`` (old GPUs, some VMs).
        process_memory: bytes each process uses; None models NVML_VALUE_NOT_AVAILABLE.
        fail: pynvml function name -> NVML error code every call of it on this GPU raises.
    """

    model: str = "H100-80GB"
    mig_current: bool = False
    mig_pending: bool | None = None
    processes: int = 0
    reset_supported: bool = True
    lost: bool = False
    utilization: int = 0
    temperature: int = 35
    power_mw: int = 70_000
    ecc_supported: bool = True
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    events_supported: bool = True
    process_memory: int | None = 1 << 30
    fail: dict[str, int] = field(default_factory=dict)
    uuid: str = ""
    name: str = ""
    gis: dict[int, FakeGi] = field(default_factory=dict)
    handle: int = 0

    def __post_init__(self) -> None:
        if self.mig_pending is None:
            self.mig_pending = self.mig_current
        if not self.name:
            self.name = _FAMILIES[self.model][3] if self.model in _FAMILIES else _PLAIN[self.model][1]

    @property
    def profiles(self) -> dict[int, Profile]:
        return geometry(self.model)

    @property
    def total_mib(self) -> int:
        return _FAMILIES[self.model][1] if self.model in _FAMILIES else _PLAIN[self.model][0]


@dataclass
class FakeEventSet:
    """An NVML event set: registered GPUs (with their masks) and queued events."""

    registered: dict[int, int] = field(default_factory=dict)  # id(FakeGpu) -> event mask
    queue: deque[tuple[FakeGpu, int, int]] = field(default_factory=deque)  # (gpu, type, data)
    freed: bool = False


_ECC_EVENTS = _real.nvmlEventTypeSingleBitEccError | _real.nvmlEventTypeDoubleBitEccError
_SUPPORTED_EVENTS = (_real.nvmlEventTypeXidCriticalError | _ECC_EVENTS | _real.nvmlEventTypePState
                     | _real.nvmlEventTypeClock)


def _err(code: int) -> _real.NVMLError:
    return _real.NVMLError(code)


def _out(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)`` or ``pointer(x)``."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    raise TypeError(f"expected ctypes.byref(...) or ctypes.pointer(...), got {type(ref).__name__}")


class FakeNvml:
    """Stand-in for the ``pynvml`` module with a configurable set of GPUs.

    Args:
        gpus: the machine's GPUs, index order.
        driver_loaded: False makes ``nvmlInit`` raise ``NVMLError_DriverNotLoaded``.
        library_found: False makes ``nvmlInit`` raise ``NVMLError_LibraryNotFound``.
        profile_info_v2: False models an old driver without the named v2 profile struct.
    """

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver_loaded: bool = True,
                 library_found: bool = True, profile_info_v2: bool = True) -> None:
        self.gpus = list(gpus or [])
        self.driver_loaded = driver_loaded
        self.library_found = library_found
        self.profile_info_v2 = profile_info_v2
        self.refcount = 0
        self.calls: list[str] = []
        self._next_addr = 0x1000
        self._handles: dict[int, tuple[str, FakeGpu, int, int]] = {}  # addr -> (kind, gpu, gi id, ci id)
        self._serial = 0
        self.event_sets: dict[int, FakeEventSet] = {}  # address -> event set
        for i, g in enumerate(self.gpus):
            if not g.uuid:
                g.uuid = f"GPU-{uuidlib.uuid5(_NS, f'gpu/{i}/{g.model}')}"
            g.handle = self._new_handle("device", g)

    # -- plumbing --

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlEventType", "nvmlFriendlyObject",
                            "nvmlStructToFriendlyObject")):
            return getattr(_real, name)
        raise AttributeError(f"FakeNvml does not model pynvml.{name}; add it to tests/runtime/fake_pynvml.py")

    def _new_handle(self, kind: str, gpu: FakeGpu, gi: int = -1, ci: int = -1) -> int:
        self._next_addr += 0x10
        self._handles[self._next_addr] = (kind, gpu, gi, ci)
        return self._next_addr

    @staticmethod
    def _ptr(addr: int, typ: Any) -> Any:
        return ctypes.cast(ctypes.c_void_p(addr), typ)

    def _resolve(self, handle: Any, *kinds: str) -> tuple[str, FakeGpu, int, int]:
        self._check_init()
        addr = ctypes.cast(handle, ctypes.c_void_p).value if not isinstance(handle, int) else handle
        entry = self._handles.get(addr or 0)
        if entry is None or entry[0] not in kinds:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if entry[1].lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        if entry[1].fail:
            frame = sys._getframe(1)
            while frame is not None and not frame.f_code.co_name.startswith("nvml"):
                frame = frame.f_back  # type: ignore[assignment]
            code = entry[1].fail.get(frame.f_code.co_name) if frame is not None else None
            if code is not None:
                raise _err(code)
        return entry

    def _device(self, handle: Any) -> FakeGpu:
        return self._resolve(handle, "device")[1]

    def _gi(self, handle: Any) -> tuple[FakeGpu, FakeGi]:
        _, gpu, gi_id, _ = self._resolve(handle, "gi")
        if gi_id not in gpu.gis:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gpu.gis[gi_id]

    def _check_init(self) -> None:
        if self.refcount <= 0:
            raise _err(_real.NVML_ERROR_UNINITIALIZED)

    def _mig_required(self, gpu: FakeGpu) -> None:
        if not gpu.profiles:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)

    def _mig_on(self, gpu: FakeGpu) -> None:
        self._mig_required(gpu)
        if not gpu.mig_current:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)

    def _profile_by_id(self, gpu: FakeGpu, profile_id: int) -> Profile:
        for p in gpu.profiles.values():
            if p.id == profile_id:
                return p
        raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_list(self, gpu: FakeGpu) -> list[tuple[FakeGi, FakeCi]]:
        return [(gi, ci) for gi in sorted(gpu.gis.values(), key=lambda g: g.id)
                for ci in sorted(gi.cis.values(), key=lambda c: c.id)]

    # -- library --

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if not self.library_found:
            raise _err(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if not self.driver_loaded:
            raise _err(_real.NVML_ERROR_DRIVER_NOT_LOADED)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.refcount -= 1

    # -- devices --

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self._ptr(self.gpus[index].handle, _real.c_nvmlDevice_t)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._check_init()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self.gpus:
            if g.uuid == text:
                return self._ptr(g.handle, _real.c_nvmlDevice_t)
        raise _err(_real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self.gpus.index(self._device(handle))

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        kind, gpu, gi, ci = self._resolve(handle, "device", "mig")
        if kind == "mig":
            return gpu.gis[gi].cis[ci].uuid
        return gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        kind, gpu, gi, _ = self._resolve(handle, "device", "mig")
        if kind == "mig":
            return f"{gpu.name} MIG {gpu.gis[gi].profile.name}"
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._device(handle)
        mem = _real.c_nvmlMemory_t()
        mem.total = gpu.total_mib * 1024 * 1024
        mem.used = min(mem.total, gpu.processes * 1024 * 1024 * 1024)
        mem.free = mem.total - mem.used
        return mem

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._device(handle)
        migs = self._mig_list(gpu)
        out = []
        for k in range(gpu.processes):
            gi_id, ci_id = (migs[k % len(migs)][0].id, migs[k % len(migs)][1].id) if migs else (0xFFFFFFFF,) * 2
            out.append(_real.nvmlFriendlyObject({"pid": 1000 + k, "usedGpuMemory": gpu.process_memory,
                                                 "gpuInstanceId": gi_id, "computeInstanceId": ci_id}))
        return out

    # -- telemetry --

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._device(handle)
        if gpu.mig_current:  # per-GPU utilisation is not reported while MIG is on
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        util = _real.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.utilization, gpu.utilization // 2
        return util

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._device(handle)
        if sensor != _real.NVML_TEMPERATURE_GPU:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device(handle).power_mw  # milliwatts, as NVML reports

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._device(handle)
        if counterType not in (_real.NVML_VOLATILE_ECC, _real.NVML_AGGREGATE_ECC) or errorType not in (
                _real.NVML_MEMORY_ERROR_TYPE_CORRECTED, _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.ecc_supported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        if errorType == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return 0
        return gpu.ecc_volatile if counterType == _real.NVML_VOLATILE_ECC else gpu.ecc_aggregate

    # -- events --

    def _event_set(self, eventSet: Any) -> FakeEventSet:
        self._check_init()
        addr = ctypes.cast(eventSet, ctypes.c_void_p).value or 0
        es = self.event_sets.get(addr)
        if es is None or es.freed:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu = self._device(handle)
        if not gpu.events_supported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return _SUPPORTED_EVENTS if gpu.ecc_supported else _SUPPORTED_EVENTS & ~_ECC_EVENTS

    def nvmlEventSetCreate(self) -> Any:
        self._check_init()
        self._next_addr += 0x10
        self.event_sets[self._next_addr] = FakeEventSet()
        return self._ptr(self._next_addr, _real.c_nvmlEventSet_t)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._device(handle)
        es = self._event_set(eventSet)
        if eventTypes & ~self.nvmlDeviceGetSupportedEventTypes(handle):
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)  # some requested type is not supported
        es.registered[id(gpu)] = es.registered.get(id(gpu), 0) | int(eventTypes)

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        es = self._event_set(eventSet)
        self.calls.append(f"nvmlEventSetWait_v2({timeoutms})")
        if not es.queue:
            raise _err(_real.NVML_ERROR_TIMEOUT)  # the fake does not sleep
        gpu, kind, value = es.queue.popleft()
        data = _real.c_nvmlEventData_t()
        data.device = self._ptr(gpu.handle, _real.c_nvmlDevice_t)
        data.eventType, data.eventData = kind, value
        data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
        return data

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_set(eventSet).freed = True

    # -- fault injection (not pynvml) --

    def _emit(self, gpu: FakeGpu, kind: int, value: int) -> None:
        for es in self.event_sets.values():
            if not es.freed and es.registered.get(id(gpu), 0) & kind:
                es.queue.append((gpu, kind, value))

    def inject_xid(self, index: int, xid: int) -> None:
        """An Xid critical error on GPU ``index`` (delivered to every event set watching it)."""
        self._emit(self.gpus[index], _real.nvmlEventTypeXidCriticalError, xid)

    def inject_ecc(self, index: int, count: int = 1, *, event: bool = True) -> None:
        """``count`` uncorrected ECC errors on GPU ``index``; ``event=False`` only bumps the counters."""
        gpu = self.gpus[index]
        gpu.ecc_volatile += count
        gpu.ecc_aggregate += count
        if event:
            self._emit(gpu, _real.nvmlEventTypeDoubleBitEccError, 0)

    # -- MIG mode --

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._device(device)
        self._mig_required(gpu)
        return [int(gpu.mig_current), int(bool(gpu.mig_pending))]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        gpu = self._device(device)
        self._mig_required(gpu)
        if mode not in (_real.NVML_DEVICE_MIG_DISABLE, _real.NVML_DEVICE_MIG_ENABLE):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.gis and mode == _real.NVML_DEVICE_MIG_DISABLE:
            raise _err(_real.NVML_ERROR_IN_USE)  # instances must be destroyed first
        gpu.mig_pending = bool(mode)
        if gpu.mig_current == gpu.mig_pending:
            return _real.NVML_SUCCESS
        if gpu.processes:
            return _real.NVML_ERROR_IN_USE
        if not gpu.reset_supported:
            return _real.NVML_ERROR_RESET_REQUIRED
        gpu.mig_current = gpu.mig_pending
        gpu.gis.clear()
        return _real.NVML_SUCCESS

    # -- GPU instances --

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        gpu = self._device(device)
        self._mig_required(gpu)
        if version == 2 and not self.profile_info_v2:
            raise _err(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not 0 <= profile < _real.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        p = gpu.profiles.get(profile)
        if p is None:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        info = _real.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else _real.c_nvmlGpuInstanceProfileInfo_t()
        info.id, info.isP2pSupported, info.sliceCount = p.id, 0, p.slices
        info.instanceCount, info.multiprocessorCount, info.memorySizeMB = p.max_count, p.sms, p.memory_mb
        info.copyEngineCount, info.decoderCount, info.encoderCount = p.slices, p.slices // 2, 0
        info.jpegCount, info.ofaCount = int("+me" in p.name or p.slices == 7), int("+me" in p.name or p.slices == 7)
        if version == 2:
            info.name = f"MIG {p.name}".encode()
        return info

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        gpu = self._device(device)
        self._mig_on(gpu)
        p = self._profile_by_id(gpu, profileId)
        return sum(1 for s in p.starts if self._fits(gpu, p, s) is None)

    def _fits(self, gpu: FakeGpu, p: Profile, start: int) -> int | None:
        """None if a ``p`` instance can be created at ``start``, else the NVML error code."""
        if start not in p.starts:
            return _real.NVML_ERROR_INVALID_ARGUMENT
        used = {s for gi in gpu.gis.values() for s in range(gi.start, gi.start + gi.profile.mem_slices)}
        if used & set(range(start, start + p.mem_slices)):
            return _real.NVML_ERROR_INSUFFICIENT_RESOURCES
        if sum(gi.profile.slices for gi in gpu.gis.values()) + p.slices > 7:
            return _real.NVML_ERROR_INSUFFICIENT_RESOURCES
        if sum(1 for gi in gpu.gis.values() if gi.profile.id == p.id) >= p.max_count:
            return _real.NVML_ERROR_INSUFFICIENT_RESOURCES
        if "+me" in p.name and any("+me" in gi.profile.name for gi in gpu.gis.values()):
            return _real.NVML_ERROR_INSUFFICIENT_RESOURCES
        return None

    def _add_gi(self, gpu: FakeGpu, p: Profile, start: int) -> Any:
        gi_id = next(i for i in range(1, 64) if i not in gpu.gis) if p.slices < 7 else 0
        gi = FakeGi(gi_id, p, start)
        gi.handle = self._new_handle("gi", gpu, gi_id)
        gpu.gis[gi_id] = gi
        return self._ptr(gi.handle, _real.c_nvmlGpuInstance_t)

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        gpu = self._device(device)
        self._mig_on(gpu)
        p = self._profile_by_id(gpu, profileId)
        for s in p.starts:
            if self._fits(gpu, p, s) is None:
                return self._add_gi(gpu, p, s)
        raise _err(_real.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        gpu = self._device(device)
        self._mig_on(gpu)
        if isinstance(placement, ctypes.Structure):
            raise TypeError("placement must be passed by reference (ctypes.byref): NVML takes a pointer")
        pl = _out(placement)
        p = self._profile_by_id(gpu, profileId)
        if pl.size != p.mem_slices:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        code = self._fits(gpu, p, pl.start)
        if code is not None:
            raise _err(code)
        return self._add_gi(gpu, p, pl.start)

    def nvmlDeviceGetGpuInstances(self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any) -> int:
        gpu = self._device(device)
        self._mig_on(gpu)
        p = self._profile_by_id(gpu, profileId)
        found = [gi for gi in sorted(gpu.gis.values(), key=lambda g: g.id) if gi.profile.id == p.id]
        if len(gpuInstancesRef) < len(found):
            raise _err(_real.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            gpuInstancesRef[i] = self._ptr(gi.handle, _real.c_nvmlGpuInstance_t)
        _out(countRef).value = len(found)
        return _real.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu = self._device(device)
        self._mig_on(gpu)
        if gpuInstanceId not in gpu.gis:
            raise _err(_real.NVML_ERROR_NOT_FOUND)
        return self._ptr(gpu.gis[gpuInstanceId].handle, _real.c_nvmlGpuInstance_t)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gpu, gi = self._gi(gpuInstance)
        info = _real.c_nvmlGpuInstanceInfo_t()
        info.device = self._ptr(gpu.handle, _real.c_nvmlDevice_t)
        info.id, info.profileId = gi.id, gi.profile.id
        info.placement.start, info.placement.size = gi.start, gi.profile.mem_slices
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gpu, gi = self._gi(gpuInstance)
        if gi.cis or gpu.processes:
            raise _err(_real.NVML_ERROR_IN_USE)
        del gpu.gis[gi.id]
        return _real.NVML_SUCCESS

    # -- compute instances --

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device: Any, profile: int, engProfile: int,
                                                     version: int = 2) -> Any:
        _gpu, gi = self._gi(device)
        if engProfile != _real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= profile < _real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        slices = _CI_SLICES.get(profile)
        if slices is None or slices > gi.profile.slices or (gi.profile.slices == 4 and slices == 3):
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        info = (_real.c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2
                else _real.c_nvmlComputeInstanceProfileInfo_t())
        info.id, info.sliceCount, info.instanceCount = profile, slices, gi.profile.slices // slices
        info.multiprocessorCount = gi.profile.sms // gi.profile.slices * slices
        if version == 2:
            full = slices == gi.profile.slices
            info.name = (f"MIG {gi.profile.name}" if full else f"MIG {slices}c.{gi.profile.name}").encode()
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gpu, gi = self._gi(gpuInstance)
        slices = _CI_SLICES.get(profileId)
        if slices is None or slices > gi.profile.slices:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if sum(c.slices for c in gi.cis.values()) + slices > gi.profile.slices:
            raise _err(_real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(64) if i not in gi.cis)
        start = sum(c.slices for c in gi.cis.values())
        self._serial += 1
        ci = FakeCi(ci_id, profileId, slices, start,
                    f"MIG-{uuidlib.uuid5(_NS, f'{gpu.uuid}/{gi.id}/{ci_id}/{self._serial}')}")
        ci.handle = self._new_handle("ci", gpu, gi.id, ci_id)
        ci.mig_handle = self._new_handle("mig", gpu, gi.id, ci_id)
        gi.cis[ci_id] = ci
        return self._ptr(ci.handle, _real.c_nvmlComputeInstance_t)

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance: Any, profileId: int, computeInstancesRef: Any,
                                           countRef: Any) -> int:
        _gpu, gi = self._gi(gpuInstance)
        found = [c for c in sorted(gi.cis.values(), key=lambda c: c.id) if c.profile_id == profileId]
        if len(computeInstancesRef) < len(found):
            raise _err(_real.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, c in enumerate(found):
            computeInstancesRef[i] = self._ptr(c.handle, _real.c_nvmlComputeInstance_t)
        _out(countRef).value = len(found)
        return _real.NVML_SUCCESS

    def _ci(self, handle: Any) -> tuple[FakeGpu, FakeGi, FakeCi]:
        _, gpu, gi_id, ci_id = self._resolve(handle, "ci")
        gi = gpu.gis.get(gi_id)
        if gi is None or ci_id not in gi.cis:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi, gi.cis[ci_id]

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        gpu, gi, ci = self._ci(computeInstance)
        if gpu.processes:
            raise _err(_real.NVML_ERROR_IN_USE)
        del gi.cis[ci.id]
        return _real.NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        gpu, gi, ci = self._ci(computeInstance)
        info = _real.c_nvmlComputeInstanceInfo_t()
        info.device = self._ptr(gpu.handle, _real.c_nvmlDevice_t)
        info.gpuInstance = self._ptr(gi.handle, _real.c_nvmlGpuInstance_t)
        info.id, info.profileId = ci.id, ci.profile_id
        info.placement.start, info.placement.size = ci.start, ci.slices
        return info

    # -- MIG devices --

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._device(device)
        self._mig_required(gpu)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._device(device)
        self._mig_on(gpu)
        migs = self._mig_list(gpu)
        if not 0 <= index < 7:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(migs):
            raise _err(_real.NVML_ERROR_NOT_FOUND)
        return self._ptr(migs[index][1].mig_handle, _real.c_nvmlDevice_t)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        kind, _, _, _ = self._resolve(device, "device", "mig")
        return ctypes.c_uint(int(kind == "mig"))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        _, gpu, _, _ = self._resolve(migDevice, "mig")
        return self._ptr(gpu.handle, _real.c_nvmlDevice_t)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        kind, _gpu, gi, _ = self._resolve(device, "device", "mig")
        if kind != "mig":
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gi

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        kind, _gpu, _, ci = self._resolve(device, "device", "mig")
        if kind != "mig":
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return ci

    # -- test helpers (not pynvml) --

    def layout(self, index: int) -> dict[str, int]:
        """Profile counts of GPU ``index`` as seen from the inside (for assertions)."""
        out: dict[str, int] = {}
        for gi, _ci in self._mig_list(self.gpus[index]):
            out[gi.profile.name] = out.get(gi.profile.name, 0) + 1
        return out

    def placements(self, index: int) -> list[tuple[str, int]]:
        return sorted((gi.profile.name, gi.start) for gi in self.gpus[index].gis.values())
