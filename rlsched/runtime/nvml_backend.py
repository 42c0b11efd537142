"""The local machine's GPUs through NVML (nvidia-ml-py), behind :class:`GpuBackend`.

``pynvml`` is imported lazily, in :class:`NvmlBackend`'s constructor, so importing
this module (``rlsched validate``, the simulated backend, the name tables below)
never loads NVML. The module is injectable (``NvmlBackend(nvml=fake)``) so that the
backend's own code runs in tests against ``tests/runtime/fake_pynvml.py``.

What it does with NVML, following mig-parted's ``pkg/mig/config`` and
``shared/docs/PRIOR_ART.md`` sections 6-7:

* **Inventory**: per GPU index, UUID, marketing name, memory, MIG mode (current,
  pending), compute processes, and for MIG GPUs every MIG device (one per
  compute instance) with its GPU-instance profile name, placement start and MIG
  UUID. A GPU instance without a compute instance is no MIG device and is not
  reported, so a half-built layout never looks like a finished one and the next
  apply recreates it.
* **MIG mode**: ``nvmlDeviceSetMigMode`` records the pending mode and tries the
  reset itself; if the mode is still pending afterwards the GPU is in use
  (:class:`GpuInUseError`) or needs a reset NVML cannot do in place
  (:class:`ResetRequiredError`). Instances are destroyed before MIG is disabled.
* **MIG layout**: all-or-nothing like mig-parted: destroy every compute and GPU
  instance, then create each GPU instance at the placement chosen by
  :func:`rlsched.cluster.feasibility.place_mig_devices` (the layout check the
  simulated backend makes too) with one compute instance using all of its slices.
  On a failure midway the GPU is cleared again, leaving it with no MIG devices
  (mig-parted's behaviour), and the error says so.

Errors: ``NVMLError_InUse`` becomes :class:`GpuInUseError`; a missing library or
driver becomes ``BackendError("NVML not available: ...")``; every other NVML error
becomes :class:`BackendError` naming the node and GPU.

Cordoning has no NVML counterpart: the flag lives in this backend object, which is
what one ``apply`` process or the node's scheduler service consults.

Telemetry and health (not part of :class:`GpuBackend`; the scheduler service reads them):

* :meth:`NvmlBackend.telemetry`: per GPU utilisation, memory, temperature, power,
  volatile double-bit (uncorrected) ECC count and compute processes. A reading the
  device does not support (``NVML_ERROR_NOT_SUPPORTED``, e.g. utilisation on a
  MIG-enabled GPU) is ``None``; any other NVML error on one GPU yields that GPU's
  dict with ``error`` set, and the other GPUs are still reported.
* :meth:`NvmlBackend.health_events`: registers one NVML event set for Xid critical
  errors and double-bit ECC errors (what the Kubernetes device plugin watches),
  drains it, and also compares the volatile uncorrected ECC counters: any count
  above the last one seen (starting from 0, the counter's value at driver load,
  as DCGM's memory health watch does) is an event too. Xids that application bugs
  cause (:data:`APPLICATION_XIDS`, the device plugin's default skip list) are not
  health events. A GPU with an event stays ``healthy=False`` in :meth:`inventory`
  for the life of the backend object.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rlsched.cluster.catalog import CATALOG, GpuModel, MigProfile, gpu_model, resolve_model_name
from rlsched.cluster.feasibility import place_mig_devices
from rlsched.errors import RlschedError
from rlsched.runtime.backend import (
    BackendError,
    GpuInfo,
    GpuInUseError,
    MigDevice,
    NodeInfo,
    ResetRequiredError,
)

# --- NVML marketing names ------------------------------------------------------------

#: NVML device names (``nvmlDeviceGetName``) -> canonical catalogue model. The first
#: name listed for a model is the one a simulated fleet reports.
NVML_NAMES: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": "H100-80GB",
    "NVIDIA H100 PCIe": "H100-80GB",
    "NVIDIA H100": "H100-80GB",
    "NVIDIA H800": "H800-80GB",
    "NVIDIA H800 80GB HBM3": "H800-80GB",
    "NVIDIA H200": "H200-141GB",
    "NVIDIA H200 NVL": "H200-141GB",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB",
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB",
    "NVIDIA A800-SXM4-80GB": "A800-80GB",
    "NVIDIA A800 80GB PCIe": "A800-80GB",
    "Tesla V100-SXM2-16GB": "V100-16GB",
    "Tesla V100-PCIE-16GB": "V100-16GB",
    "Tesla V100-SXM2-32GB": "V100-32GB",
    "Tesla V100-PCIE-32GB": "V100-32GB",
    "Tesla P100-PCIE-16GB": "P100-16GB",
    "Tesla P100-SXM2-16GB": "P100-16GB",
    "Tesla K80": "K80",
    "Tesla T4": "T4",
    "NVIDIA A10": "A10",
    "NVIDIA L4": "L4",
    "Quadro RTX 6000": "RTX6000",
}

_PREFERRED_NAME: dict[str, str] = {}
for _name, _model in NVML_NAMES.items():
    _PREFERRED_NAME.setdefault(_model, _name)

#: Total framebuffer as ``nvmlDeviceGetMemoryInfo(h).total`` reports it, in MiB.
_MEMORY_MIB: dict[str, int] = {
    "H100-80GB": 81559,
    "H800-80GB": 81559,
    "H200-141GB": 143771,
    "A100-80GB": 81920,
    "A800-80GB": 81920,
    "A100-40GB": 40960,
}


def marketing_name(model: str) -> str:
    """The NVML device name a GPU of catalogue ``model`` reports (e.g. "NVIDIA H100 80GB HBM3")."""
    return _PREFERRED_NAME.get(model, f"NVIDIA {model}")


def nvml_memory_mib(model: str) -> int:
    """Total memory in MiB that NVML reports for ``model`` (catalogue GB x 1024 where unknown)."""
    if model in _MEMORY_MIB:
        return _MEMORY_MIB[model]
    return CATALOG[model].memory_gb * 1024 if model in CATALOG else 0


def model_from_nvml_name(name: str) -> str:
    """Canonical catalogue model for an NVML device name, or "" if unknown."""
    if name in NVML_NAMES:
        return NVML_NAMES[name]
    for prefix in ("NVIDIA ", "Tesla ", "Quadro "):
        if name.startswith(prefix):
            found = resolve_model_name(name[len(prefix):])
            if found:
                return found
    return resolve_model_name(name) or ""


# --- NVML profile tables ---------------------------------------------------------------

#: GPU-instance profile enum -> (compute slices, memory slices, media extensions), used
#: to name a profile when the driver's profile info carries no name (v1 structs).
_GI_ENUM_SHAPES: dict[str, tuple[int, int, bool]] = {
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE": (1, 1, False),
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": (1, 1, True),
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2": (1, 2, False),
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE": (2, 2, False),
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE": (3, 4, False),
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE": (4, 4, False),
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE": (7, 8, False),
}

#: Compute slices of a GPU instance -> the compute-instance profile enum using all of them.
_CI_ENUM_FOR_SLICES: dict[int, str] = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
}

_MIB = 1024 * 1024

#: Xids caused by applications, not the GPU (k8s-device-plugin's default skip list):
#: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
#: 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

#: The keys of one :meth:`NvmlBackend.telemetry` entry (``error`` only on a failed read).
TELEMETRY_KEYS = ("hostname", "uuid", "index", "healthy", "utilization_gpu", "memory_used_mib", "memory_total_mib",
                  "temperature_c", "power_w", "ecc_double_bit", "processes")


@dataclass(frozen=True, slots=True)
class _GiProfile:
    """A GPU-instance profile as this GPU's driver reports it."""

    name: str  # "1g.10gb"
    id: int  # profile id for create/list calls (not the enum)
    slices: int  # compute slices
    max_count: int  # instanceCount: size of the array nvmlDeviceGetGpuInstances fills


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _profile_from_shape(model: GpuModel | None, shape: tuple[int, int, bool]) -> str:
    if model is None:
        return ""
    compute, memory, me = shape
    for p in model.mig_profiles:
        if p.compute_slices == compute and p.memory_slices == memory and ("+me" in p.name) == me:
            return p.name
    return ""


class NvmlBackend:
    """:class:`~rlsched.runtime.backend.GpuBackend` for the GPUs of this machine.

    Args:
        nvml: the ``pynvml`` module, or a stand-in with the same functions (tests);
            imported on first use when omitted.
        hostname: the name this node reports (default ``socket.gethostname()``).

    Raises:
        BackendError: "NVML not available: ..." when nvidia-ml-py is missing or the
            library/driver cannot be initialised.
    """

    def __init__(self, nvml: Any | None = None, hostname: str | None = None,
                 ignored_xids: frozenset[int] | set[int] = APPLICATION_XIDS) -> None:
        if nvml is None:
            try:
                import pynvml as nvml_module
            except ImportError as exc:
                raise BackendError(
                    "NVML not available: the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
                ) from exc
            nvml = nvml_module
        self._nvml: Any = nvml
        self.hostname = hostname or socket.gethostname()
        self.name = f"nvml:{self.hostname}"
        self._cordoned = False
        self.ignored_xids = frozenset(ignored_xids)
        self._unhealthy: dict[str, str] = {}  # GPU UUID -> first health event's reason
        self._ecc_seen: dict[str, int] = {}  # GPU UUID -> last volatile uncorrected ECC count read
        self._pending: list[tuple[str, str]] = []  # events found by telemetry(), returned by health_events()
        self._event_set: Any = None
        self._event_uuids: dict[int, str] = {}  # device handle address -> GPU UUID (registered devices)
        #: indices of GPUs whose events could not be registered (ECC counters are still polled)
        self.events_unsupported: list[int] = []
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendError(f"NVML not available: {exc} (is the NVIDIA driver installed and loaded?)") from exc
        self._open = True

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        if self._open:
            self._open = False
            if self._event_set is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- error translation --

    def _translate(self, exc: Exception, where: str) -> BackendError:
        nv = self._nvml
        if isinstance(exc, nv.NVMLError_InUse):
            return GpuInUseError(f"{where}: the GPU is in use by another client (NVML_ERROR_IN_USE); drain it first")
        if isinstance(exc, nv.NVMLError_ResetRequired):
            return ResetRequiredError(f"{where}: the GPU must be reset (NVML_ERROR_RESET_REQUIRED)")
        if isinstance(exc, (nv.NVMLError_Uninitialized, nv.NVMLError_LibraryNotFound, nv.NVMLError_DriverNotLoaded,
                            nv.NVMLError_LibRmVersionMismatch)):
            return BackendError(f"NVML not available: {exc} ({where})")
        if isinstance(exc, nv.NVMLError_NoPermission):
            return BackendError(f"{where}: permission denied by NVML ({exc}); MIG changes need root")
        if isinstance(exc, nv.NVMLError_NotSupported):
            return BackendError(f"{where}: not supported on this GPU ({exc})")
        return BackendError(f"{where}: NVML error: {exc}")

    @contextlib.contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        try:
            yield
        except self._nvml.NVMLError as exc:
            raise self._translate(exc, where) from exc

    def _check_host(self, hostname: str) -> None:
        if hostname != self.hostname:
            raise BackendError(f"the nvml backend only manages the local node {self.hostname}, not {hostname!r}")

    # -- device lookup and reads --

    def _handles(self) -> list[tuple[int, Any]]:
        nv = self._nvml
        return [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]

    def _device(self, hostname: str, gpu_uuid: str) -> tuple[int, Any, str]:
        """(index, handle, "GPU host/idx (uuid, name)") of the GPU with ``gpu_uuid``."""
        self._check_host(hostname)
        nv = self._nvml
        with self._errors(f"node {hostname}"):
            for index, handle in self._handles():
                if _text(nv.nvmlDeviceGetUUID(handle)) == gpu_uuid:
                    name = _text(nv.nvmlDeviceGetName(handle))
                    return index, handle, f"GPU {hostname}/{index} ({gpu_uuid}, {name})"
        raise BackendError(f"node {hostname} has no GPU with UUID {gpu_uuid}")

    def _mig_mode(self, handle: Any) -> tuple[bool, bool] | None:
        """(current, pending), or None where the GPU does not support MIG."""
        nv = self._nvml
        try:
            current, pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError_NotSupported:
            return None
        return current == nv.NVML_DEVICE_MIG_ENABLE, pending == nv.NVML_DEVICE_MIG_ENABLE

    def _processes(self, handle: Any) -> int:
        nv = self._nvml
        try:
            return len(nv.nvmlDeviceGetComputeRunningProcesses(handle))
        except nv.NVMLError_NotSupported:
            return 0

    def _gi_profiles(self, handle: Any, model: GpuModel | None) -> dict[int, _GiProfile]:
        """Every GPU-instance profile the GPU supports, keyed by profile id."""
        nv = self._nvml
        shapes = {getattr(nv, k): v for k, v in _GI_ENUM_SHAPES.items() if hasattr(nv, k)}
        out: dict[int, _GiProfile] = {}
        for enum in range(int(nv.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                try:
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
                except nv.NVMLError_FunctionNotFound:  # driver before the v2 (named) struct
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                continue
            name = _text(getattr(info, "name", b"")).strip()
            name = name[4:] if name.startswith("MIG ") else name
            if not name and enum in shapes:
                name = _profile_from_shape(model, shapes[enum])
            if not name:
                name = f"profile-{info.id}"
            out[int(info.id)] = _GiProfile(name, int(info.id), int(info.sliceCount), int(info.instanceCount))
        return out

    def _gpu_instances(self, handle: Any, profiles: Mapping[int, _GiProfile]) -> list[tuple[Any, _GiProfile, int, int]]:
        """(GI handle, profile, GI id, placement start) of every GPU instance."""
        nv = self._nvml
        out: list[tuple[Any, _GiProfile, int, int]] = []
        for prof in profiles.values():
            arr = (nv.c_nvmlGpuInstance_t * max(prof.max_count, 1))()
            count = ctypes.c_uint(0)
            nv.nvmlDeviceGetGpuInstances(handle, prof.id, arr, ctypes.byref(count))
            for i in range(count.value):
                info = nv.nvmlGpuInstanceGetInfo(arr[i])
                out.append((arr[i], prof, int(info.id), int(info.placement.start)))
        return out

    def _mig_devices(self, handle: Any, model: GpuModel | None) -> tuple[MigDevice, ...]:
        nv = self._nvml
        gis = {gi_id: (prof.name, start) for _, prof, gi_id, start in
               self._gpu_instances(handle, self._gi_profiles(handle, model))}
        devices: list[MigDevice] = []
        for i in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nv.NVMLError_NotFound:
                continue
            gi_id = int(nv.nvmlDeviceGetGpuInstanceId(mig))
            profile, start = gis.get(gi_id, ("unknown", 0))
            devices.append(MigDevice(profile, _text(nv.nvmlDeviceGetUUID(mig)), start))
        return tuple(sorted(devices, key=lambda d: (d.start, d.profile, d.uuid)))

    def _gpu_info(self, index: int, handle: Any) -> GpuInfo:
        """One GPU; a GPU that fell off the bus is reported unhealthy rather than failing the node."""
        nv = self._nvml
        uuid = name = model_name = ""
        try:
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            name = _text(nv.nvmlDeviceGetName(handle))
            model_name = model_from_nvml_name(name)
            memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            mode = self._mig_mode(handle)
            current, pending = mode if mode is not None else (False, False)
            model = gpu_model(model_name) if model_name else None
            devices = self._mig_devices(handle, model) if current else ()
            processes = self._processes(handle)
        except nv.NVMLError_GpuIsLost:
            return GpuInfo(index=index, uuid=uuid, name=name, model=model_name, memory_mib=0, healthy=False)
        return GpuInfo(index=index, uuid=uuid, name=name, model=model_name, memory_mib=memory,
                       mig_current=current, mig_pending=pending, mig_devices=devices,
                       healthy=uuid not in self._unhealthy, processes=processes)

    # -- GpuBackend --

    def inventory(self) -> list[NodeInfo]:
        """This machine, as the only node."""
        return [self.node(self.hostname)]

    def node(self, hostname: str) -> NodeInfo:
        """Every GPU of this machine (raises BackendError for any other hostname)."""
        self._check_host(hostname)
        with self._errors(f"node {hostname}"):
            gpus = tuple(self._gpu_info(i, h) for i, h in self._handles())
        return NodeInfo(hostname=self.hostname, gpus=gpus, reachable=True, cordoned=self._cordoned)

    def cordon(self, hostname: str, on: bool) -> None:
        """Record the cordon flag (NVML has none; see the module docstring)."""
        self._check_host(hostname)
        self._cordoned = bool(on)

    def running_jobs(self, hostname: str) -> int:
        """Compute processes over every GPU of this machine."""
        self._check_host(hostname)
        with self._errors(f"node {hostname}"):
            return sum(self._processes(h) for _, h in self._handles())

    def set_mig_mode(self, hostname: str, gpu_uuid: str, enabled: bool) -> None:
        """Set the MIG mode; raises if it stays pending (in use, or reset required)."""
        nv = self._nvml
        index, handle, where = self._device(hostname, gpu_uuid)
        want = nv.NVML_DEVICE_MIG_ENABLE if enabled else nv.NVML_DEVICE_MIG_DISABLE
        state = "enable" if enabled else "disable"
        with self._errors(f"{where}: set MIG mode {state}"):
            mode = self._mig_mode(handle)
            if mode is None:
                raise BackendError(f"{where}: MIG is not supported on this GPU")
            if mode == (bool(enabled), bool(enabled)):
                return
            if not enabled and mode[0]:
                self._clear(handle)
            status = nv.nvmlDeviceSetMigMode(handle, want)
            after = self._mig_mode(handle)
            busy = self._processes(handle)
        if after is not None and after[0] == bool(enabled):
            return
        if status == nv.NVML_ERROR_IN_USE or busy:
            raise GpuInUseError(
                f"{where}: MIG mode is in pending {state} state: the GPU is in use by {busy or 'another'} "
                f"client(s); stop them, then set the mode again (or reset the GPU)"
            )
        raise ResetRequiredError(
            f"{where}: MIG mode is in pending {state} state until the GPU is reset "
            f"(nvidia-smi -r -i {index}) or the node rebooted"
        )

    def _clear(self, handle: Any) -> None:
        """Destroy every compute instance, then every GPU instance (mig-parted's ClearMigConfig)."""
        nv = self._nvml
        for gi, _prof, _gi_id, _start in self._gpu_instances(handle, self._gi_profiles(handle, None)):
            for ci_enum in range(int(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
                try:
                    ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, ci_enum, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                    continue
                arr = (nv.c_nvmlComputeInstance_t * max(int(ci_info.instanceCount), 1))()
                count = ctypes.c_uint(0)
                nv.nvmlGpuInstanceGetComputeInstances(gi, ci_info.id, arr, ctypes.byref(count))
                for i in range(count.value):
                    nv.nvmlComputeInstanceDestroy(arr[i])
            nv.nvmlGpuInstanceDestroy(gi)

    def set_mig_layout(self, hostname: str, gpu_uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        """Replace every MIG instance of the GPU with ``devices`` (all-or-nothing)."""
        nv = self._nvml
        index, handle, where = self._device(hostname, gpu_uuid)
        with self._errors(where):
            gpu_name = _text(nv.nvmlDeviceGetName(handle))
            model_name = model_from_nvml_name(gpu_name)
            mode = self._mig_mode(handle)
        if not model_name or mode is None or not gpu_model(model_name).mig_capable:
            raise BackendError(f"{where}: MIG is not supported on this GPU")
        if not mode[0]:
            why = "enable is pending a GPU reset" if mode[1] else "mode is disabled"
            raise BackendError(f"{where}: cannot create MIG instances: MIG {why}")
        model = gpu_model(model_name)
        try:
            placed = place_mig_devices(model, devices, gpu_name)
        except RlschedError as exc:
            raise BackendError(f"{where}: {exc}") from None
        with self._errors(where):
            busy = self._processes(handle)
            if busy:
                raise GpuInUseError(f"{where}: cannot destroy MIG instances: in use by {busy} process(es); drain it")
            by_name = {p.name: p for p in self._gi_profiles(handle, model).values()}
        missing = sorted({prof.name for prof, _ in placed if prof.name not in by_name})
        if missing:
            raise BackendError(f"{where}: the driver offers no MIG profile {', '.join(missing)} on this GPU")
        with self._errors(f"{where}: destroying MIG instances"):
            self._clear(handle)
        current: tuple[MigProfile, int] | None = None
        try:
            for prof, start in placed:
                current = (prof, start)
                self._create(handle, by_name[prof.name], prof, start)
        except nv.NVMLError as exc:
            with contextlib.suppress(nv.NVMLError):
                self._clear(handle)
            assert current is not None
            what = f"{where}: creating {current[0].name} at slice {current[1]}"
            err = self._translate(exc, what)
            raise type(err)(f"{err}; the GPU was left with no MIG devices") from exc
        with self._errors(where):
            return self._gpu_info(index, handle)

    def _create(self, handle: Any, gi_prof: _GiProfile, prof: MigProfile, start: int) -> None:
        """One GPU instance at ``start`` plus one compute instance spanning it."""
        nv = self._nvml
        placement = nv.c_nvmlGpuInstancePlacement_t(start=start, size=prof.memory_slices)
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, gi_prof.id, ctypes.byref(placement))
        ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, getattr(nv, _CI_ENUM_FOR_SLICES[gi_prof.slices]), nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)

    # -- telemetry and health (not part of GpuBackend) --

    def _optional(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, or None where the device does not support the reading."""
        try:
            return fn(*args)
        except self._nvml.NVMLError_NotSupported:
            return None

    def _ecc_double_bit(self, handle: Any) -> int | None:
        nv = self._nvml
        count = self._optional(nv.nvmlDeviceGetTotalEccErrors, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                               nv.NVML_VOLATILE_ECC)
        return None if count is None else int(count)

    def _mark(self, uuid: str, reason: str) -> tuple[str, str]:
        self._unhealthy.setdefault(uuid, reason)
        return uuid, reason

    def _note_ecc(self, uuid: str, count: int | None) -> tuple[str, str] | None:
        """A health event if the volatile uncorrected ECC count grew since it was last read."""
        if count is None or not uuid:
            return None
        before = self._ecc_seen.get(uuid, 0)
        self._ecc_seen[uuid] = max(before, count)
        if count > before:
            return self._mark(uuid, f"double-bit ECC: {count - before} new uncorrected error(s) "
                                    f"({count} since driver load)")
        return None

    def _gpu_telemetry(self, index: int, handle: Any) -> dict[str, Any]:
        nv = self._nvml
        out: dict[str, Any] = dict.fromkeys(TELEMETRY_KEYS)
        out["hostname"], out["index"] = self.hostname, index
        try:
            out["uuid"] = uuid = _text(nv.nvmlDeviceGetUUID(handle))
            util = self._optional(nv.nvmlDeviceGetUtilizationRates, handle)
            out["utilization_gpu"] = None if util is None else int(util.gpu)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            out["memory_used_mib"] = int(mem.used) // _MIB
            out["memory_total_mib"] = int(mem.total) // _MIB
            temp = self._optional(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
            out["temperature_c"] = None if temp is None else int(temp)
            milliwatts = self._optional(nv.nvmlDeviceGetPowerUsage, handle)
            out["power_w"] = None if milliwatts is None else int(milliwatts) / 1000.0
            out["ecc_double_bit"] = ecc = self._ecc_double_bit(handle)
            procs = self._optional(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
            out["processes"] = [
                {"pid": int(p.pid),
                 "used_memory_mib": None if getattr(p, "usedGpuMemory", None) is None
                 else int(p.usedGpuMemory) // _MIB}
                for p in procs
            ]
        except nv.NVMLError as exc:
            out["error"] = str(self._translate(exc, f"GPU {self.hostname}/{index}"))
            if isinstance(exc, nv.NVMLError_GpuIsLost) and out["uuid"]:
                self._mark(out["uuid"], "GPU is lost (fell off the bus)")
        else:
            event = self._note_ecc(uuid, ecc)
            if event is not None:
                self._pending.append(event)
        out["healthy"] = bool(out["uuid"]) and out["uuid"] not in self._unhealthy and "error" not in out
        return out

    def telemetry(self) -> list[dict[str, Any]]:
        """One dict per GPU (keys :data:`TELEMETRY_KEYS`, plus ``error`` where reading it failed).

        ``utilization_gpu`` is percent, ``power_w`` watts (NVML reports milliwatts),
        ``ecc_double_bit`` the volatile uncorrected ECC count; a reading the device
        does not support is None. ``processes`` lists ``{"pid", "used_memory_mib"}``
        (``used_memory_mib`` None where NVML cannot tell, as under WDDM).
        """
        with self._errors(f"node {self.hostname}"):
            handles = self._handles()
        return [self._gpu_telemetry(i, h) for i, h in handles]

    def _register_events(self) -> None:
        """Create the event set and register every GPU once (devices without support are skipped)."""
        nv = self._nvml
        wanted = int(nv.nvmlEventTypeXidCriticalError) | int(nv.nvmlEventTypeDoubleBitEccError)
        event_set = nv.nvmlEventSetCreate()
        try:
            handles = self._handles()
        except nv.NVMLError:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(event_set)
            raise
        self._event_set = event_set
        for index, handle in handles:
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                try:
                    mask = wanted & int(nv.nvmlDeviceGetSupportedEventTypes(handle))
                except nv.NVMLError_NotSupported:
                    mask = wanted
                if mask:
                    nv.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    self._event_uuids[_address(handle)] = uuid
                else:
                    self.events_unsupported.append(index)
            except nv.NVMLError:  # NOT_SUPPORTED (too old, or a VM), or a lost GPU: no events from it
                self.events_unsupported.append(index)

    def _event_reason(self, data: Any) -> str | None:
        nv = self._nvml
        kind = int(data.eventType)
        if kind & int(nv.nvmlEventTypeXidCriticalError):
            xid = int(data.eventData)
            return None if xid in self.ignored_xids else f"Xid {xid} (critical error)"
        if kind & int(nv.nvmlEventTypeDoubleBitEccError):
            return "double-bit ECC error"
        return f"NVML event 0x{kind:x}"

    def health_events(self, timeout_ms: int = 0) -> list[tuple[str, str]]:
        """(GPU UUID, reason) of every health event since the last call.

        Waits up to ``timeout_ms`` for the first event, then drains the rest without
        waiting; also reports growth of the volatile uncorrected ECC counters (and
        events :meth:`telemetry` found). Each reported GPU is unhealthy from now on.
        """
        nv = self._nvml
        events, self._pending = self._pending, []
        with self._errors(f"node {self.hostname}: health events"):
            if self._event_set is None:
                self._register_events()
            wait = max(int(timeout_ms), 0)
            while True:
                try:
                    data = nv.nvmlEventSetWait_v2(self._event_set, wait)
                except nv.NVMLError_Timeout:
                    break
                wait = 0
                reason = self._event_reason(data)
                if reason is None:
                    continue
                uuid = self._event_uuids.get(_address(data.device))
                if uuid is None:
                    try:
                        uuid = _text(nv.nvmlDeviceGetUUID(data.device))
                    except nv.NVMLError:
                        uuid = ""
                events.append(self._mark(uuid, reason))
            for _index, handle in self._handles():
                try:
                    uuid = _text(nv.nvmlDeviceGetUUID(handle))
                    event = self._note_ecc(uuid, self._ecc_double_bit(handle))
                except nv.NVMLError:  # one unreadable GPU does not hide the others' counters
                    continue
                if event is not None:
                    events.append(event)
        return events

    def unhealthy(self) -> dict[str, str]:
        """GPU UUID -> reason for every GPU this backend object has seen a health event on."""
        return dict(self._unhealthy)


def _address(handle: Any) -> int:
    """The address a ctypes device handle points at (handles compare by it)."""
    if isinstance(handle, int):
        return handle
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
