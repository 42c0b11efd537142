"""A simulated GPU fleet in a JSON file, behaving like NVML and mig-parted.

``plan`` refreshes from it and ``apply`` drives it, so plan -> apply -> plan is a real
round trip on a laptop: every mutation rewrites the file atomically (temp file,
fsync, rename, fsync of the directory), so a reader, or a process killed with
``kill -9`` mid-write, only ever sees the old or the new fleet, never a torn file.
Writers also hold an ``flock`` on ``<file>.lock`` so two concurrent applies cannot
lose each other's updates.

Fleet file format (version 1; unknown keys are errors, as in mig-parted's strict
``spec.go``)::

    {
      "version": 1,
      "nodes": [
        {
          "hostname": "gpu-h100-01",
          "reachable": true,            # false: every call on the node fails
          "cordoned": false,
          "labels": {},                 # optional, string -> string
          "gpus": [
            {
              "index": 0,
              "uuid": "GPU-0b6e...",
              "name": "NVIDIA H100 80GB HBM3",   # NVML marketing name
              "model": "H100-80GB",              # canonical catalogue name
              "memory_mib": 81559,
              "mig_current": true,
              "mig_pending": true,
              "mig_devices": [{"profile": "3g.40gb", "uuid": "MIG-...", "start": 0}],
              "healthy": true,
              "processes": 0,           # simulated running jobs on this GPU
              "generation": 3,          # optional: bumped per layout change (MIG UUID seed)
              "telemetry": {            # optional: what NvmlBackend.telemetry() would read
                "utilization_gpu": 40, "memory_used_mib": 2048, "temperature_c": 55,
                "power_w": 300.5, "ecc_double_bit": 0   # each optional, a number or null
              },
              "xid": [79]               # optional: Xid critical errors so far (append-only)
            }
          ]
        }
      ],
      "faults": {"gpu-h100-02": "fail_set_layout"}   # optional, see below
    }

Behaviour (chosen to match NVML / mig-parted, see ``shared/docs/HCL.md`` s. 2 and 6):

* **MIG mode.** ``set_mig_mode`` first records the request as the *pending* mode,
  as ``nvmlDeviceSetMigMode`` does, then tries the GPU reset that activates it.
  Rule: *the reset happens immediately when the GPU is idle* (``processes == 0``);
  current becomes pending and the GPU has no MIG devices afterwards (MIG layouts do
  not survive a mode change). With processes the reset is blocked: the pending
  mode stays different from the current one (observable in ``inventory``) and the
  call raises :class:`GpuInUseError`, like nvidia-smi's "pending enable state ...
  In use by another client". A later call (or :meth:`SimulatedBackend.reset_gpu`)
  on the idle GPU completes the reset.
* **MIG layout.** All-or-nothing per GPU: every instance is destroyed and the
  requested counts are created at placements from
  :func:`rlsched.cluster.feasibility.place_mig_devices` (the layout check the NVML
  backend makes too) with fresh MIG UUIDs
  (``uuid5(gpu uuid, generation, slot)``, so tests are reproducible). Refused with
  :class:`BackendError` (naming GPU and model) if MIG is not on or the layout does
  not fit, with :class:`GpuInUseError` if processes run on the GPU; a refusal
  changes nothing.
* **Unreachable nodes** raise :class:`BackendError` on every call naming them; in
  :meth:`~SimulatedBackend.inventory` they appear with ``reachable=False`` and no
  GPUs (nothing is known about them).
* **Telemetry and health** (the scheduler service without a GPU):
  :meth:`~SimulatedBackend.telemetry` returns NvmlBackend's per-GPU dicts from the
  optional ``telemetry`` fields (defaults: idle, no ECC errors; utilisation None on
  a MIG-enabled GPU, as NVML); :meth:`~SimulatedBackend.health_events` reports each
  ``xid`` entry not yet reported by this backend object (application Xids such as 13
  or 31 excepted, as NvmlBackend does) and every increase of
  ``telemetry.ecc_double_bit``; such GPUs are ``healthy=False`` in this object's
  inventory from then on (the file itself is not changed).
* **Faults** (testing apply failure paths through the real CLI): ``faults`` maps a
  hostname or a GPU UUID to a fault name, or a list of them; the next matching call
  consumes one and fails:

  - ``fail_set_layout``: the layout call destroys every instance, then fails
    creating (mig-parted leaves the GPU with no MIG devices on failure);
  - ``fail_set_mode``: ``set_mig_mode`` fails before touching the GPU;
  - ``reset_required``: ``set_mig_mode`` records the pending mode, then raises
    :class:`ResetRequiredError` (a GPU whose reset is not possible in place);
  - ``fail_cordon``: ``cordon`` fails;
  - ``in_use``: the next ``set_mig_mode``/``set_mig_layout`` raises
    :class:`GpuInUseError` as if a client had just attached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import re
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsched.cluster.catalog import gpu_model, resolve_model_name
from rlsched.cluster.feasibility import format_mig_counts, pack_layout, place_mig_devices
from rlsched.cluster.shorthand import resolve_layout_text
from rlsched.errors import RlschedError
from rlsched.posix import atomic_write, exclusive_lock
from rlsched.runtime.backend import (
    BackendError,
    GpuInfo,
    GpuInUseError,
    MigDevice,
    NodeInfo,
    ResetRequiredError,
)
from rlsched.runtime.nvml_backend import APPLICATION_XIDS, TELEMETRY_KEYS, marketing_name, nvml_memory_mib

FLEET_VERSION = 1

#: Fault names a fleet file may inject (see the module docstring).
FAULTS = ("fail_set_layout", "fail_set_mode", "reset_required", "fail_cordon", "in_use")

#: Namespace of every simulated GPU and MIG UUID (fixed so fleets are reproducible).
_SIM_NS = uuidlib.UUID("6f1c1d2e-5c1b-4f4a-9b59-2d6f0c0a7e11")

_TOP_KEYS = {"version", "nodes", "faults"}
_NODE_KEYS = {"hostname", "reachable", "cordoned", "labels", "gpus"}
_GPU_KEYS = {
    "index", "uuid", "name", "model", "memory_mib", "mig_current", "mig_pending",
    "mig_devices", "healthy", "processes", "generation", "telemetry", "xid",
}
#: Optional keys of a GPU's ``telemetry`` object.
_TELEMETRY_KEYS = {"utilization_gpu", "memory_used_mib", "temperature_c", "power_w", "ecc_double_bit"}
_MIG_KEYS = {"profile", "uuid", "start"}


# --- file I/O ------------------------------------------------------------------------


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented JSON (mode 0644) with :func:`rlsched.posix.atomic_write`.

    Its temporary files are ``.<name>.*.tmp``, the pattern the next mutation sweeps.
    """
    atomic_write(path, json.dumps(data, indent=2) + "\n", mode=0o644)


def _unknown_keys(where: str, got: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(got) - allowed)
    if extra:
        key = extra[0]
        close = difflib.get_close_matches(key, sorted(allowed), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(sorted(allowed))}"
        raise BackendError(f"{where}: unknown field {key!r}{hint}")


def _req(where: str, obj: Mapping[str, Any], key: str, typ: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise BackendError(f"{where}: missing required field {key!r}")
    val = obj[key]
    if not isinstance(val, typ) or (typ is int and isinstance(val, bool)):
        raise BackendError(f"{where}: field {key!r} has the wrong type ({type(val).__name__})")
    return val


def _opt(where: str, obj: Mapping[str, Any], key: str, typ: type, default: Any) -> Any:
    if key not in obj:
        return default
    return _req(where, obj, key, typ)


def validate_fleet(data: Any, source: str = "fleet") -> None:
    """Check a fleet document against the version-1 schema (closed world).

    Raises:
        BackendError: naming the file and the node/GPU path of the first problem.
    """
    if not isinstance(data, dict):
        raise BackendError(f"{source}: expected a JSON object at the top level")
    _unknown_keys(source, data, _TOP_KEYS)
    version = _req(source, data, "version", int)
    if version != FLEET_VERSION:
        raise BackendError(f"{source}: unsupported fleet version {version} (this rlsched reads {FLEET_VERSION})")
    nodes = _req(source, data, "nodes", list)
    hosts: set[str] = set()
    uuids: set[str] = set()
    for i, node in enumerate(nodes):
        where = f"{source}: nodes[{i}]"
        if not isinstance(node, dict):
            raise BackendError(f"{where}: expected an object")
        _unknown_keys(where, node, _NODE_KEYS)
        host = _req(where, node, "hostname", str)
        where = f"{source}: node {host}"
        if host in hosts:
            raise BackendError(f"{where}: hostname appears twice")
        hosts.add(host)
        _opt(where, node, "reachable", bool, True)
        _opt(where, node, "cordoned", bool, False)
        labels = _opt(where, node, "labels", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise BackendError(f"{where}: labels must map strings to strings")
        indices: set[int] = set()
        for j, gpu in enumerate(_req(where, node, "gpus", list)):
            gwhere = f"{where} gpus[{j}]"
            if not isinstance(gpu, dict):
                raise BackendError(f"{gwhere}: expected an object")
            _unknown_keys(gwhere, gpu, _GPU_KEYS)
            idx = _req(gwhere, gpu, "index", int)
            if idx in indices:
                raise BackendError(f"{gwhere}: GPU index {idx} appears twice")
            indices.add(idx)
            guid = _req(gwhere, gpu, "uuid", str)
            if guid in uuids:
                raise BackendError(f"{gwhere}: GPU UUID {guid} appears twice in the fleet")
            uuids.add(guid)
            _req(gwhere, gpu, "name", str)
            _opt(gwhere, gpu, "model", str, "")
            _req(gwhere, gpu, "memory_mib", int)
            _opt(gwhere, gpu, "mig_current", bool, False)
            _opt(gwhere, gpu, "mig_pending", bool, False)
            _opt(gwhere, gpu, "healthy", bool, True)
            if _opt(gwhere, gpu, "processes", int, 0) < 0:
                raise BackendError(f"{gwhere}: processes must be >= 0")
            _opt(gwhere, gpu, "generation", int, 0)
            tel = _opt(gwhere, gpu, "telemetry", dict, {})
            _unknown_keys(f"{gwhere} telemetry", tel, _TELEMETRY_KEYS)
            for key, val in tel.items():
                if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0):
                    raise BackendError(f"{gwhere} telemetry: {key!r} must be a number >= 0 or null, got {val!r}")
            if isinstance(tel.get("ecc_double_bit"), float):
                raise BackendError(f"{gwhere} telemetry: 'ecc_double_bit' must be an integer count")
            for xid in _opt(gwhere, gpu, "xid", list, []):
                if isinstance(xid, bool) or not isinstance(xid, int) or xid <= 0:
                    raise BackendError(f"{gwhere}: xid entries must be positive integers (Xid codes), got {xid!r}")
            for k, dev in enumerate(_opt(gwhere, gpu, "mig_devices", list, [])):
                dwhere = f"{gwhere} mig_devices[{k}]"
                if not isinstance(dev, dict):
                    raise BackendError(f"{dwhere}: expected an object")
                _unknown_keys(dwhere, dev, _MIG_KEYS)
                _req(dwhere, dev, "profile", str)
                _req(dwhere, dev, "uuid", str)
                _opt(dwhere, dev, "start", int, 0)
    faults = _opt(source, data, "faults", dict, {})
    for key, val in faults.items():
        names = val if isinstance(val, list) else [val]
        for name in names:
            if name not in FAULTS:
                close = difflib.get_close_matches(str(name), FAULTS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(FAULTS)}"
                raise BackendError(f"{source}: faults[{key!r}]: unknown fault {name!r}{hint}")


def read_fleet(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and validate a fleet file.

    Raises:
        BackendError: if the file is missing, not JSON, or not a version-1 fleet.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BackendError(
            f"fleet file {p} does not exist; create one with: rlsched inventory init --nodes 2x8xH100-80GB --out {p}"
        ) from None
    except OSError as exc:
        raise BackendError(f"cannot read fleet file {p}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BackendError(f"{p}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    validate_fleet(data, str(p))
    return data


# --- conversions ---------------------------------------------------------------------


def _gpu_info(g: Mapping[str, Any]) -> GpuInfo:
    return GpuInfo(
        index=g["index"],
        uuid=g["uuid"],
        name=g["name"],
        model=g.get("model", ""),
        memory_mib=g["memory_mib"],
        mig_current=g.get("mig_current", False),
        mig_pending=g.get("mig_pending", False),
        mig_devices=tuple(
            MigDevice(d["profile"], d["uuid"], d.get("start", 0))
            for d in sorted(g.get("mig_devices", []), key=lambda d: (d.get("start", 0), d["profile"]))
        ),
        healthy=g.get("healthy", True),
        processes=g.get("processes", 0),
    )


def _node_info(n: Mapping[str, Any]) -> NodeInfo:
    if not n.get("reachable", True):
        return NodeInfo(hostname=n["hostname"], gpus=(), reachable=False, cordoned=n.get("cordoned", False),
                        labels=dict(n.get("labels", {})))
    return NodeInfo(
        hostname=n["hostname"],
        gpus=tuple(_gpu_info(g) for g in sorted(n["gpus"], key=lambda g: g["index"])),
        reachable=True,
        cordoned=n.get("cordoned", False),
        labels=dict(n.get("labels", {})),
    )


def gpu_uuid_for(hostname: str, index: int) -> str:
    """Deterministic NVML-style GPU UUID for a simulated GPU."""
    return f"GPU-{uuidlib.uuid5(_SIM_NS, f'{hostname}/{index}')}"


def mig_uuid_for(gpu_uuid: str, generation: int, slot: int) -> str:
    """Deterministic NVML-style MIG UUID: fresh for every layout generation of a GPU."""
    return f"MIG-{uuidlib.uuid5(_SIM_NS, f'{gpu_uuid}/{generation}/{slot}')}"


def _where(node: Mapping[str, Any], gpu: Mapping[str, Any]) -> str:
    model = gpu.get("model") or "unknown model"
    return f"GPU {node['hostname']}/{gpu['index']} ({gpu['uuid']}, {gpu['name']} [{model}])"


# --- the backend ---------------------------------------------------------------------


class SimulatedBackend:
    """:class:`~rlsched.runtime.backend.GpuBackend` over a JSON fleet file.

    Every call re-reads the file (another process, such as ``apply``, may have
    changed it) and every mutation rewrites it atomically under a lock.

    Args:
        path: the fleet file (see the module docstring for its format).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = f"sim:{self.path}"
        self._unhealthy: dict[str, str] = {}  # GPU UUID -> first health event's reason
        self._xid_seen: dict[str, int] = {}  # GPU UUID -> xid entries already reported
        self._ecc_seen: dict[str, int] = {}  # GPU UUID -> last ecc_double_bit seen
        self._pending: list[tuple[str, str]] = []  # ECC growth telemetry() saw, for health_events()
        read_fleet(self.path)  # fail early and clearly on a bad file

    # -- helpers --

    def _load(self) -> dict[str, Any]:
        return read_fleet(self.path)

    @contextlib.contextmanager
    def _mutate(self) -> Iterator[dict[str, Any]]:
        """Load under the lock, let the caller change the dict, write it back.

        The write happens even when the body raises, because a failing NVML call can
        still change the GPU (a pending MIG mode, instances destroyed before a failed
        create) and the fleet must show that afterwards.
        """
        with exclusive_lock(self.path.with_name(self.path.name + ".lock")):
            self._remove_stale_temps()
            data = self._load()
            try:
                yield data
            finally:
                write_json_atomic(self.path, data)

    def _remove_stale_temps(self, age_s: float = 60.0) -> None:
        """Delete temp files left by writers killed mid-write (older than ``age_s``)."""
        import time

        now = time.time()
        for tmp in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                if now - tmp.stat().st_mtime > age_s:
                    tmp.unlink()

    @staticmethod
    def _find_node(data: Mapping[str, Any], hostname: str) -> dict[str, Any]:
        for n in data["nodes"]:
            if n["hostname"] == hostname:
                if not n.get("reachable", True):
                    raise BackendError(f"node {hostname} is unreachable")
                return n
        known = [n["hostname"] for n in data["nodes"]]
        close = difflib.get_close_matches(hostname, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise BackendError(f"unknown node {hostname!r}{hint}")

    def _find_gpu(self, data: Mapping[str, Any], hostname: str, gpu_uuid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        node = self._find_node(data, hostname)
        for g in node["gpus"]:
            if g["uuid"] == gpu_uuid:
                return node, g
        raise BackendError(f"node {hostname} has no GPU with UUID {gpu_uuid}")

    @staticmethod
    def _take_fault(data: dict[str, Any], keys: tuple[str, ...], names: tuple[str, ...]) -> str | None:
        """Consume the first queued fault among ``names`` for any of ``keys``."""
        faults: dict[str, Any] = data.get("faults", {})
        for key in keys:
            queued = faults.get(key)
            if queued is None:
                continue
            lst = queued if isinstance(queued, list) else [queued]
            for i, name in enumerate(lst):
                if name in names:
                    rest = lst[:i] + lst[i + 1:]
                    if rest:
                        faults[key] = rest
                    else:
                        del faults[key]
                    if not faults:
                        data.pop("faults", None)
                    return str(name)
        return None

    # -- GpuBackend --

    def inventory(self) -> list[NodeInfo]:
        """Every node in the fleet; unreachable ones with ``reachable=False`` and no GPUs."""
        return [self._health(_node_info(n)) for n in self._load()["nodes"]]

    def node(self, hostname: str) -> NodeInfo:
        """One node (raises BackendError if unknown or unreachable)."""
        return self._health(_node_info(self._find_node(self._load(), hostname)))

    def _health(self, node: NodeInfo) -> NodeInfo:
        """``node`` with the GPUs this object saw a health event on marked unhealthy."""
        if not any(g.uuid in self._unhealthy for g in node.gpus):
            return node
        gpus = tuple(dataclasses.replace(g, healthy=False) if g.uuid in self._unhealthy else g for g in node.gpus)
        return dataclasses.replace(node, gpus=gpus)

    def cordon(self, hostname: str, on: bool) -> None:
        """Mark the node (un)schedulable in the fleet file."""
        with self._mutate() as data:
            node = self._find_node(data, hostname)
            if self._take_fault(data, (hostname,), ("fail_cordon",)):
                raise BackendError(f"cordon {hostname}: injected fault fail_cordon")
            node["cordoned"] = bool(on)

    def running_jobs(self, hostname: str) -> int:
        """Simulated jobs on the node: the sum of ``processes`` over its GPUs."""
        node = self._find_node(self._load(), hostname)
        return sum(int(g.get("processes", 0)) for g in node["gpus"])

    def set_mig_mode(self, hostname: str, gpu_uuid: str, enabled: bool) -> None:
        """Request a MIG mode; the reset that activates it happens only on an idle GPU.

        Raises:
            BackendError: unknown/unreachable node or GPU, a model without MIG, or an
                injected ``fail_set_mode``.
            GpuInUseError: processes block the reset; the mode stays *pending*. Disabling
                a GPU that has MIG devices is refused before anything changes (NVML destroys
                the instances first, which processes prevent).
            ResetRequiredError: injected ``reset_required``; the mode stays *pending*.

        Asking for the current mode back cancels a pending change; that needs no reset.
        """
        with self._mutate() as data:
            node, gpu = self._find_gpu(data, hostname, gpu_uuid)
            where = _where(node, gpu)
            model = resolve_model_name(gpu.get("model", "") or gpu["name"])
            if model is None or not gpu_model(model).mig_capable:
                raise BackendError(f"{where}: MIG is not supported on this GPU")
            keys = (gpu_uuid, hostname)
            if self._take_fault(data, keys, ("fail_set_mode",)):
                raise BackendError(f"{where}: setting MIG mode failed (injected fault fail_set_mode)")
            want = bool(enabled)
            if gpu.get("mig_current", False) == want and gpu.get("mig_pending", False) == want:
                return
            busy = gpu.get("processes", 0)
            if not want and gpu.get("mig_current", False) and gpu.get("mig_devices") and busy:
                raise GpuInUseError(f"{where}: cannot destroy MIG instances to disable MIG: in use by {busy} "
                                    f"process(es); drain it first")
            gpu["mig_pending"] = want
            if gpu.get("mig_current", False) == want:
                return
            state = "enable" if want else "disable"
            if self._take_fault(data, keys, ("in_use",)) or gpu.get("processes", 0) > 0:
                raise GpuInUseError(
                    f"{where}: MIG mode is in pending {state} state: the GPU is in use by "
                    f"{gpu.get('processes', 0) or 'a'} process(es); drain it, then set the mode again to reset it"
                )
            if self._take_fault(data, keys, ("reset_required",)):
                raise ResetRequiredError(
                    f"{where}: MIG mode is in pending {state} state until the GPU is reset or the node rebooted"
                )
            self._reset(gpu)

    def set_mig_layout(self, hostname: str, gpu_uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        """Destroy every MIG instance on the GPU and create ``devices`` (all-or-nothing).

        Raises:
            BackendError: MIG not enabled, unknown profile, a layout that does not fit
                the model, or an injected ``fail_set_layout`` (after which the GPU has
                no MIG devices, as mig-parted leaves it).
            GpuInUseError: processes run on the GPU (nothing is changed).
        """
        with self._mutate() as data:
            node, gpu = self._find_gpu(data, hostname, gpu_uuid)
            where = _where(node, gpu)
            model_name = resolve_model_name(gpu.get("model", "") or gpu["name"])
            if model_name is None or not gpu_model(model_name).mig_capable:
                raise BackendError(f"{where}: MIG is not supported on this GPU")
            if not gpu.get("mig_current", False):
                why = "enable is pending a GPU reset" if gpu.get("mig_pending") else "mode is disabled"
                raise BackendError(f"{where}: cannot create MIG instances: MIG {why}")
            try:
                placed = place_mig_devices(gpu_model(model_name), devices, gpu["name"])
            except RlschedError as exc:
                raise BackendError(f"{where}: {exc}") from None
            if self._take_fault(data, (gpu_uuid, hostname), ("in_use",)) or gpu.get("processes", 0) > 0:
                raise GpuInUseError(
                    f"{where}: cannot destroy MIG instances: in use by {gpu.get('processes', 0) or 'a'} process(es); "
                    f"drain it first"
                )
            generation = int(gpu.get("generation", 0)) + 1
            gpu["generation"] = generation
            gpu["mig_devices"] = []
            if self._take_fault(data, (gpu_uuid, hostname), ("fail_set_layout",)):
                raise BackendError(
                    f"{where}: creating MIG layout {format_mig_counts(devices)} failed "
                    f"(injected fault fail_set_layout); "
                    f"the GPU was left with no MIG devices"
                )
            gpu["mig_devices"] = [
                {"profile": prof.name, "uuid": mig_uuid_for(gpu_uuid, generation, slot), "start": start}
                for slot, (prof, start) in enumerate(placed)
            ]
            return _gpu_info(gpu)

    # -- telemetry and health (NvmlBackend's shapes; not part of GpuBackend) --

    def _note_ecc(self, uuid: str, count: int | None) -> tuple[str, str] | None:
        if count is None:
            return None
        before = self._ecc_seen.get(uuid, 0)
        self._ecc_seen[uuid] = max(before, count)
        if count > before:
            reason = f"double-bit ECC: {count - before} new uncorrected error(s) ({count} since driver load)"
            self._unhealthy.setdefault(uuid, reason)
            return uuid, reason
        return None

    def telemetry(self) -> list[dict[str, Any]]:
        """Per GPU of every reachable node, the dict :meth:`NvmlBackend.telemetry` returns.

        Readings come from the GPU's optional ``telemetry`` object; ``processes`` lists
        one ``{"pid": None, "used_memory_mib": None}`` per simulated process.
        """
        out: list[dict[str, Any]] = []
        for n in self._load()["nodes"]:
            if not n.get("reachable", True):
                continue
            for g in sorted(n["gpus"], key=lambda g: g["index"]):
                tel = g.get("telemetry", {})
                mig = g.get("mig_current", False)
                row: dict[str, Any] = dict.fromkeys(TELEMETRY_KEYS)
                row.update({
                    "hostname": n["hostname"], "uuid": g["uuid"], "index": g["index"],
                    "utilization_gpu": tel.get("utilization_gpu", None if mig else 0),
                    "memory_used_mib": tel.get("memory_used_mib", 0),
                    "memory_total_mib": g["memory_mib"],
                    "temperature_c": tel.get("temperature_c"),
                    "power_w": tel.get("power_w"),
                    "ecc_double_bit": tel.get("ecc_double_bit", 0),
                    "processes": [{"pid": None, "used_memory_mib": None}] * int(g.get("processes", 0)),
                })
                event = self._note_ecc(g["uuid"], row["ecc_double_bit"])
                if event is not None:
                    self._pending.append(event)
                row["healthy"] = g.get("healthy", True) and g["uuid"] not in self._unhealthy
                out.append(row)
        return out

    def health_events(self, timeout_ms: int = 0) -> list[tuple[str, str]]:
        """(GPU UUID, reason) for Xids and ECC growth in the file not yet reported by this object.

        Never waits (``timeout_ms`` is accepted for NvmlBackend's signature).
        """
        del timeout_ms
        events, self._pending = self._pending, []
        for n in self._load()["nodes"]:
            if not n.get("reachable", True):
                continue
            for g in sorted(n["gpus"], key=lambda g: g["index"]):
                uuid = g["uuid"]
                xids = list(g.get("xid", []))
                seen = self._xid_seen.get(uuid, 0)
                self._xid_seen[uuid] = len(xids)
                for xid in xids[seen:] if len(xids) >= seen else xids:
                    if xid in APPLICATION_XIDS:
                        continue
                    reason = f"Xid {xid} (critical error)"
                    self._unhealthy.setdefault(uuid, reason)
                    events.append((uuid, reason))
                event = self._note_ecc(uuid, g.get("telemetry", {}).get("ecc_double_bit"))
                if event is not None:
                    events.append(event)
        return events

    def unhealthy(self) -> dict[str, str]:
        """GPU UUID -> reason for every GPU this backend object has seen a health event on."""
        return dict(self._unhealthy)

    # -- simulation controls (not part of GpuBackend) --

    def _reset(self, gpu: dict[str, Any]) -> None:
        if gpu.get("mig_current", False) != gpu.get("mig_pending", False):
            gpu["mig_current"] = gpu.get("mig_pending", False)
            gpu["mig_devices"] = []
            gpu["generation"] = int(gpu.get("generation", 0)) + 1

    def reset_gpu(self, hostname: str, gpu_uuid: str) -> None:
        """Reset a GPU (``nvidia-smi -r``): activates a pending MIG mode.

        Raises:
            GpuInUseError: if processes still run on it.
        """
        with self._mutate() as data:
            node, gpu = self._find_gpu(data, hostname, gpu_uuid)
            if gpu.get("processes", 0) > 0:
                raise GpuInUseError(f"{_where(node, gpu)}: cannot reset: in use by {gpu['processes']} process(es)")
            self._reset(gpu)

    def set_processes(self, hostname: str, gpu_uuid: str, processes: int) -> None:
        """Simulate jobs starting or ending on a GPU."""
        if processes < 0:
            raise BackendError("processes must be >= 0")
        with self._mutate() as data:
            _, gpu = self._find_gpu(data, hostname, gpu_uuid)
            gpu["processes"] = int(processes)

    def set_reachable(self, hostname: str, reachable: bool) -> None:
        """Simulate a node dropping off (or coming back to) the network."""
        with self._mutate() as data:
            for n in data["nodes"]:
                if n["hostname"] == hostname:
                    n["reachable"] = bool(reachable)
                    return
            raise BackendError(f"unknown node {hostname!r}")

    def inject_xid(self, hostname: str, gpu_uuid: str, xid: int) -> None:
        """Simulate an Xid critical error on a GPU (appended to its ``xid`` list)."""
        if isinstance(xid, bool) or not isinstance(xid, int) or xid <= 0:
            raise BackendError(f"xid must be a positive integer, got {xid!r}")
        with self._mutate() as data:
            _, gpu = self._find_gpu(data, hostname, gpu_uuid)
            gpu["xid"] = [*gpu.get("xid", []), xid]

    def set_telemetry(self, hostname: str, gpu_uuid: str, **readings: float | None) -> None:
        """Set telemetry readings of a GPU (keys of the fleet file's ``telemetry`` object)."""
        with self._mutate() as data:
            node, gpu = self._find_gpu(data, hostname, gpu_uuid)
            tel = {**gpu.get("telemetry", {}), **readings}
            probe = {"version": FLEET_VERSION, "nodes": [{"hostname": node["hostname"], "gpus": [
                {**gpu, "telemetry": tel}]}]}
            validate_fleet(probe, str(self.path))
            gpu["telemetry"] = tel

    def inject_fault(self, key: str, fault: str) -> None:
        """Queue ``fault`` for the node or GPU UUID ``key`` (consumed by the next matching call)."""
        if fault not in FAULTS:
            raise BackendError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        with self._mutate() as data:
            faults = data.setdefault("faults", {})
            queued = faults.get(key)
            faults[key] = [*(queued if isinstance(queued, list) else [queued] if queued else []), fault]


# --- fleet construction ("inventory init") ---------------------------------------------

_GROUP_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*([A-Za-z0-9._-]+?)\s*(?::\s*([A-Za-z0-9._+,-]+))?\s*$")


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """One ``<nodes>x<gpus>x<model>[:<mig>]`` term of ``inventory init --nodes``."""

    nodes: int
    gpus_per_node: int
    model: str
    mig: str | None = None


def parse_node_groups(spec: str) -> list[NodeGroup]:
    """Parse ``4x8xH100-80GB,2x8xA100-80GB:balanced`` into groups (model names canonicalised).

    Raises:
        BackendError: with the offending term and the expected shape.
    """
    groups: list[NodeGroup] = []
    # Split on commas that start a new group, so "1g.10gb,3g.40gb" layouts survive.
    for term in re.split(r",(?=\s*\d+\s*x)", spec):
        if not term.strip():
            continue
        m = _GROUP_RE.match(term)
        if m is None:
            raise BackendError(
                f"--nodes: cannot parse {term.strip()!r}; expected NODESxGPUSxMODEL[:MIG], e.g. 4x8xH100-80GB:balanced"
            )
        n, g = int(m.group(1)), int(m.group(2))
        if n < 1 or g < 1:
            raise BackendError(f"--nodes: {term.strip()!r}: node and GPU counts must be at least 1")
        groups.append(NodeGroup(n, g, gpu_model(m.group(3)).name, m.group(4)))
    if not groups:
        raise BackendError("--nodes: no node group given (e.g. 4x8xH100-80GB)")
    return groups


def build_fleet(spec: str, mig: str | None = None, hostname_prefix: str = "gpu") -> dict[str, Any]:
    """A fresh fleet document: idle, healthy, reachable nodes.

    Hostnames are ``<prefix>-<family>-<NN>`` (``gpu-h100-01``), numbered per family
    across groups. ``mig`` (a layout name such as ``balanced`` or ``all-1g``, profile
    names joined by ``,``/``+``, or ``disabled``) applies to every MIG-capable group
    without its own ``:MIG`` suffix; other models stay MIG-disabled. A group suffix
    on a model without MIG is an error.
    """
    data: dict[str, Any] = {"version": FLEET_VERSION, "nodes": []}
    counters: dict[str, int] = {}
    for group in parse_node_groups(spec):
        model = gpu_model(group.model)
        layout_name = group.mig if group.mig is not None else mig
        if group.mig is not None and group.mig != "disabled" and not model.mig_capable:
            raise BackendError(f"--nodes: {model.name} does not support MIG (asked for {group.mig!r})")
        names: tuple[str, ...] | None = None
        if layout_name and layout_name != "disabled" and model.mig_capable:
            try:
                names = resolve_layout_text(model, layout_name)
            except RlschedError as exc:
                raise BackendError(f"--mig {layout_name}: {exc}") from None
            placed = pack_layout(model, names)
            assert placed is not None  # resolve_layout checked the fit
        family = model.name.split("-")[0].lower()
        for _ in range(group.nodes):
            counters[family] = counters.get(family, 0) + 1
            host = f"{hostname_prefix}-{family}-{counters[family]:02d}"
            gpus = []
            for idx in range(group.gpus_per_node):
                guid = gpu_uuid_for(host, idx)
                devs: list[dict[str, Any]] = []
                if names is not None:
                    devs = [
                        {"profile": p.name, "uuid": mig_uuid_for(guid, 1, slot), "start": start}
                        for slot, (p, start) in enumerate(pack_layout(model, names) or [])
                    ]
                gpus.append({
                    "index": idx,
                    "uuid": guid,
                    "name": marketing_name(model.name),
                    "model": model.name,
                    "memory_mib": nvml_memory_mib(model.name),
                    "mig_current": names is not None,
                    "mig_pending": names is not None,
                    "mig_devices": devs,
                    "healthy": True,
                    "processes": 0,
                    "generation": 1 if names is not None else 0,
                })
            data["nodes"].append({"hostname": host, "reachable": True, "cordoned": False, "labels": {}, "gpus": gpus})
    validate_fleet(data, "generated fleet")
    return data
