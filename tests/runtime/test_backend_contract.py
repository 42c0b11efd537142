"""The GPU backend contract: the same checks on every :class:`~rlsched.runtime.backend.GpuBackend`.

Every test here takes the ``h`` fixture, which is parametrised over :data:`HARNESSES`:
the in-memory test double (``tests/plan/fakes.py``), the simulated fleet file,
:class:`~rlsched.runtime.nvml_backend.NvmlBackend` over the faithful fake pynvml, and
:class:`~rlsched.runtime.fleet.backend.RayBackend` on a real one-worker Ray cluster whose node
agent serves a simulated fleet (every call goes through the agent actor). The job checks at
the end run the local executor on each backend's UUIDs; the fleet executor's own job checks
are in ``tests/runtime/fleet``.

**Adding a backend** (the multi-node one, say) is one entry in :data:`HARNESSES`: a
function that builds a fresh, idle fleet and returns a :class:`Harness` naming three
GPUs on it

* ``mig_gpu``: an H100-80GB with MIG on and the balanced layout
  (:data:`BALANCED`) created,
* ``plain_gpu``: an H100-80GB with MIG off,
* ``no_mig_gpu``: a model without MIG (e.g. V100-16GB),

plus the controls a test needs to play the hardware (``set_busy``, ``reopen``) and,
where the backend can model them, the optional ones (unreachable nodes, Xid and ECC
errors). A check that needs an optional control the harness lacks is skipped, as is a
check of an optional backend method (``telemetry``, ``health_events``) the backend does
not have; every other check runs.

The contract comes from the protocol's docstrings and NVML's behaviour:

* inventory: unique hostnames and ``GPU-``/``MIG-`` UUIDs, indices in order, names
  NVML reports for the model, MiB; ``node(h)`` is the inventory's entry for ``h``;
  nothing (UUIDs, MIG layout, MIG UUIDs) changes between reads or across a restart
  of the backend (a new backend object over the same GPUs);
* cordon is a flag that stops new placements only: it keeps jobs and GPUs as they are;
  ``running_jobs`` counts what runs on the node's GPUs (what a drain waits for);
* MIG mode: enabling/disabling an idle GPU takes effect at once and leaves no MIG
  devices; the same mode again is a no-op; a busy GPU raises ``GpuInUseError`` with the
  request recorded as *pending*; a model without MIG raises ``BackendError``;
* MIG layout: all-or-nothing, fresh MIG UUIDs, legal placements, the returned
  ``GpuInfo`` is what the next read shows; every illegal layout (does not fit, unknown
  profile, bad count, MIG off, no MIG) raises plain ``BackendError`` and changes
  nothing; a busy GPU raises ``GpuInUseError`` and changes nothing;
* an unknown (or unreachable) node or an unknown GPU UUID raises ``BackendError``
  naming it;
* telemetry and health events (optional methods) have NVML's keys and units, and a
  GPU with an event is unhealthy from then on;
* a job started on the UUIDs the backend reports sees exactly those in
  ``CUDA_VISIBLE_DEVICES``; exit codes, cancel (SIGTERM, grace, SIGKILL) and
  re-adoption after a restart of the service (executor and backend) work on them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest

from rlsched.cluster.catalog import gpu_model, resolve_model_name
from rlsched.runtime.backend import BackendError, GpuBackend, GpuInfo, GpuInUseError, NodeInfo, ResetRequiredError
from rlsched.runtime.executor import LocalExecutor
from rlsched.runtime.nvml_backend import TELEMETRY_KEYS, NvmlBackend, model_from_nvml_name
from rlsched.runtime.sim_backend import SimulatedBackend, build_fleet, write_json_atomic
from tests.plan.fakes import FakeBackend

from .fake_pynvml import FakeGpu, FakeNvml

#: The layout every harness's ``mig_gpu`` starts with (H100-80GB's "balanced").
BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


@dataclass(frozen=True)
class GpuRef:
    """A GPU of a harness's fleet: the node it is on and its UUID."""

    host: str
    uuid: str


@dataclass
class Harness:
    """One backend over a fresh fleet, with the controls that play its hardware.

    Attributes:
        backend: the backend under test.
        mig_gpu / plain_gpu / no_mig_gpu: see the module docstring.
        set_busy: run ``n`` compute processes on a GPU (0: idle again).
        reopen: a new backend object over the same GPUs, as a restarted process builds.
        set_reachable: take a node off the network and back (None: the backend cannot).
        inject_xid: an Xid critical error on a GPU (None: cannot be modelled).
        inject_ecc: a new double-bit (uncorrected) ECC error on a GPU (None: cannot be modelled).
        block_reset: make the GPU one that cannot be reset in place (None: cannot be modelled).
        fail_layout_create: make the next layout change on the GPU fail while creating instances,
            after the old ones are gone; returns the call that heals the GPU (None: cannot be modelled).
    """

    backend: GpuBackend
    mig_gpu: GpuRef
    plain_gpu: GpuRef
    no_mig_gpu: GpuRef
    set_busy: Callable[[GpuRef, int], None]
    reopen: Callable[[], GpuBackend]
    set_reachable: Callable[[str, bool], None] | None = None
    inject_xid: Callable[[GpuRef, int], None] | None = None
    inject_ecc: Callable[[GpuRef], None] | None = None
    block_reset: Callable[[GpuRef], None] | None = None
    fail_layout_create: Callable[[GpuRef], Callable[[], None]] | None = None

    def gpu(self, ref: GpuRef) -> GpuInfo:
        """The GPU as the backend reads it now."""
        return next(g for g in self.backend.node(ref.host).gpus if g.uuid == ref.uuid)


# --- the backends ------------------------------------------------------------------------


def fake_harness(tmp_path: Path) -> Harness:
    """The in-memory test double: node n1 (two H100s), node n2 (one V100)."""
    del tmp_path
    be = FakeBackend({"n1": 2})
    be.add_node("n2", 1, "V100-16GB")
    be.set_layout("n1", 0, BALANCED)

    def set_busy(ref: GpuRef, n: int) -> None:
        be._find(ref.host, ref.uuid)["processes"] = n

    def set_reachable(host: str, on: bool) -> None:
        be.nodes[host]["reachable"] = on

    return Harness(be, GpuRef("n1", "GPU-n1-0"), GpuRef("n1", "GPU-n1-1"), GpuRef("n2", "GPU-n2-0"),
                   set_busy=set_busy, reopen=lambda: be, set_reachable=set_reachable)


def sim_harness(tmp_path: Path) -> Harness:
    """A fleet file: gpu-h100-01 (balanced H100, H100 with MIG off), gpu-v100-01 (one V100)."""
    data = build_fleet("1x2xH100-80GB:balanced,1x1xV100-16GB")
    data["nodes"][0]["gpus"][1].update(mig_current=False, mig_pending=False, mig_devices=[], generation=0)
    path = tmp_path / "fleet.json"
    write_json_atomic(path, data)
    be = SimulatedBackend(path)
    h100, v100 = data["nodes"]

    def ref(node: Mapping[str, Any], i: int) -> GpuRef:
        return GpuRef(node["hostname"], node["gpus"][i]["uuid"])

    def fail_layout_create(r: GpuRef) -> Callable[[], None]:
        be.inject_fault(r.uuid, "fail_set_layout")  # consumed by the failing call: nothing to heal
        return lambda: None

    return Harness(be, ref(h100, 0), ref(h100, 1), ref(v100, 0),
                   set_busy=lambda r, n: be.set_processes(r.host, r.uuid, n),
                   reopen=lambda: SimulatedBackend(path),
                   set_reachable=be.set_reachable,
                   inject_xid=lambda r, xid: be.inject_xid(r.host, r.uuid, xid),
                   inject_ecc=lambda r: be.set_telemetry(r.host, r.uuid, ecc_double_bit=1),  # the fleet has 0
                   block_reset=lambda r: be.inject_fault(r.uuid, "reset_required"),
                   fail_layout_create=fail_layout_create)


def nvml_harness(tmp_path: Path) -> Harness:
    """NvmlBackend over the fake pynvml: node-a with an H100 (MIG, balanced), an H100 and a V100."""
    del tmp_path
    host = "node-a"
    fake = FakeNvml([FakeGpu("H100-80GB", mig_current=True), FakeGpu("H100-80GB"), FakeGpu("V100-16GB")])
    be = NvmlBackend(nvml=fake, hostname=host)
    uuids = [g.uuid for g in fake.gpus]
    be.set_mig_layout(host, uuids[0], BALANCED)

    def gpu(ref: GpuRef) -> FakeGpu:
        return fake.gpus[uuids.index(ref.uuid)]

    def set_busy(ref: GpuRef, n: int) -> None:
        gpu(ref).processes = n

    def block_reset(ref: GpuRef) -> None:
        gpu(ref).reset_supported = False

    def fail_layout_create(ref: GpuRef) -> Callable[[], None]:
        # The first GPU instance is created, its compute instance is not: a layout half built.
        gpu(ref).fail["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        return lambda: gpu(ref).fail.clear()

    return Harness(be, GpuRef(host, uuids[0]), GpuRef(host, uuids[1]), GpuRef(host, uuids[2]),
                   set_busy=set_busy, reopen=lambda: NvmlBackend(nvml=fake, hostname=host),
                   inject_xid=lambda r, xid: fake.inject_xid(uuids.index(r.uuid), xid),
                   inject_ecc=lambda r: fake.inject_ecc(uuids.index(r.uuid)),
                   block_reset=block_reset, fail_layout_create=fail_layout_create)


@dataclass(frozen=True)
class RayWorld:
    """A Ray cluster with one worker node whose agent serves the fleet file at ``fleet``."""

    address: str
    fleet: Path


@pytest.fixture(scope="module")
def ray_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayWorld]:
    from tests.runtime.fleet.conftest import ray_cluster

    root = tmp_path_factory.mktemp("contract-ray")
    with ray_cluster() as cluster:
        cluster.add_node(num_cpus=1, env_vars={"RLSCHED_AGENT_BACKEND": f"sim:{root / 'fleet.json'}",
                                               "RLSCHED_AGENT_STATE_DIR": str(root / "agent")})
        cluster.wait_for_nodes()
        yield RayWorld(cluster.address, root / "fleet.json")


_ray_fleets = iter(range(1, 10**6))


def ray_harness(tmp_path: Path, world: RayWorld) -> Harness:
    """RayBackend over the worker's agent; the fleet is :func:`sim_harness`'s, rewritten in place under fresh
    hostnames (so fresh UUIDs: the agent's backend outlives one test), and played through the same file."""
    data = build_fleet("1x2xH100-80GB:balanced,1x1xV100-16GB", hostname_prefix=f"ray{next(_ray_fleets)}")
    data["nodes"][0]["gpus"][1].update(mig_current=False, mig_pending=False, mig_devices=[], generation=0)
    write_json_atomic(world.fleet, data)
    from rlsched.runtime.fleet.backend import RayBackend

    be = RayBackend(world.address)
    file = SimulatedBackend(world.fleet)  # the hardware's side: what the tests do to the GPUs
    h100, v100 = data["nodes"]

    def ref(node: Mapping[str, Any], i: int) -> GpuRef:
        return GpuRef(node["hostname"], node["gpus"][i]["uuid"])

    def fail_layout_create(r: GpuRef) -> Callable[[], None]:
        file.inject_fault(r.uuid, "fail_set_layout")
        return lambda: None

    del tmp_path
    return Harness(be, ref(h100, 0), ref(h100, 1), ref(v100, 0),
                   set_busy=lambda r, n: file.set_processes(r.host, r.uuid, n),
                   reopen=lambda: RayBackend(world.address),
                   set_reachable=file.set_reachable,
                   inject_xid=lambda r, xid: file.inject_xid(r.host, r.uuid, xid),
                   inject_ecc=lambda r: file.set_telemetry(r.host, r.uuid, ecc_double_bit=1),
                   block_reset=lambda r: file.inject_fault(r.uuid, "reset_required"),
                   fail_layout_create=fail_layout_create)


#: Every backend held to the contract: name -> harness factory. A new backend is one entry (one that needs
#: a running world, like ``ray``, gets it from its fixture in :func:`h`).
HARNESSES: dict[str, Callable[[Path], Harness]] = {
    "fake": fake_harness,
    "sim": sim_harness,
    "nvml": nvml_harness,
}


@pytest.fixture(params=[*sorted(HARNESSES), "ray"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "ray":
        harness = ray_harness(tmp_path, request.getfixturevalue("ray_world"))
    else:
        harness = HARNESSES[request.param](tmp_path)
    yield harness
    close = getattr(harness.backend, "close", None)
    if close is not None:
        close()


def _reachable(nodes: list[NodeInfo]) -> list[NodeInfo]:
    return [n for n in nodes if n.reachable]


# --- inventory and identity -----------------------------------------------------------------


def test_name_is_a_non_empty_string(h: Harness) -> None:
    assert isinstance(h.backend.name, str) and h.backend.name


def test_inventory_shape(h: Harness) -> None:
    nodes = h.backend.inventory()
    assert nodes and all(isinstance(n, NodeInfo) for n in nodes)
    hosts = [n.hostname for n in nodes]
    assert len(set(hosts)) == len(hosts) and all(hosts)
    gpu_uuids: list[str] = []
    mig_uuids: list[str] = []
    for n in _reachable(nodes):
        assert n.gpus, f"{n.hostname}: a reachable node reports its GPUs"
        indices = [g.index for g in n.gpus]
        assert indices == sorted(indices) and len(set(indices)) == len(indices)
        for g in n.gpus:
            assert isinstance(g, GpuInfo) and g.uuid.startswith("GPU-") and g.healthy
            model = resolve_model_name(g.model)
            assert model is not None, f"{g.model!r} is a catalogue model"
            assert model_from_nvml_name(g.name) == model, f"{g.name!r} is the NVML name of a {model}"
            assert g.memory_mib > 0.9 * gpu_model(model).memory_gb * 1000  # MiB, not GB or bytes
            assert g.memory_mib < 1100 * gpu_model(model).memory_gb
            assert g.processes == 0  # the harness fleet is idle
            assert g.mig_current or not g.mig_devices
            assert all(d.uuid.startswith("MIG-") for d in g.mig_devices)
            gpu_uuids.append(g.uuid)
            mig_uuids.extend(d.uuid for d in g.mig_devices)
    assert len(set(gpu_uuids)) == len(gpu_uuids)
    assert len(set(mig_uuids)) == len(mig_uuids)
    for ref in (h.mig_gpu, h.plain_gpu, h.no_mig_gpu):
        assert ref.host in hosts and ref.uuid in gpu_uuids


def test_harness_gpus_are_what_the_contract_assumes(h: Harness) -> None:
    mig, plain, no_mig = h.gpu(h.mig_gpu), h.gpu(h.plain_gpu), h.gpu(h.no_mig_gpu)
    assert (mig.model, mig.mig_current, mig.mig_pending, mig.layout_counts()) == ("H100-80GB", True, True, BALANCED)
    assert (plain.model, plain.mig_current, plain.mig_pending, plain.mig_devices) == ("H100-80GB", False, False, ())
    assert not gpu_model(no_mig.model).mig_capable and not no_mig.mig_current


def test_node_is_the_inventory_entry(h: Harness) -> None:
    for n in _reachable(h.backend.inventory()):
        assert h.backend.node(n.hostname) == n
        assert h.backend.node(n.hostname).hostname == n.hostname


def test_reads_are_stable_and_survive_a_restart(h: Harness) -> None:
    first = h.backend.inventory()
    assert h.backend.inventory() == first
    again = h.reopen()
    after = again.inventory()
    assert [(n.hostname, n.fingerprint()) for n in after] == [(n.hostname, n.fingerprint()) for n in first]
    assert [n.gpus for n in after] == [n.gpus for n in first]  # UUIDs, MIG layouts and MIG UUIDs


# --- cordon and drain -------------------------------------------------------------------------


def test_cordon_is_a_flag_that_keeps_gpus_and_jobs(h: Harness) -> None:
    host = h.mig_gpu.host
    h.set_busy(h.mig_gpu, 2)
    before = h.backend.node(host)
    assert not before.cordoned and h.backend.running_jobs(host) == 2
    h.backend.cordon(host, True)
    h.backend.cordon(host, True)  # idempotent
    on = h.backend.node(host)
    assert on.cordoned and next(n for n in h.backend.inventory() if n.hostname == host).cordoned
    assert on.gpus == before.gpus and on.fingerprint() == before.fingerprint()
    assert h.backend.running_jobs(host) == 2  # cordoning stops no job
    others = [n for n in h.backend.inventory() if n.hostname != host]
    assert not any(n.cordoned for n in others)
    h.backend.cordon(host, False)
    assert h.backend.node(host) == before


def test_running_jobs_counts_what_runs_on_the_node(h: Harness) -> None:
    for n in _reachable(h.backend.inventory()):
        assert h.backend.running_jobs(n.hostname) == 0
    h.set_busy(h.plain_gpu, 3)
    assert h.backend.running_jobs(h.plain_gpu.host) == 3
    assert h.gpu(h.plain_gpu).processes == 3
    h.set_busy(h.plain_gpu, 0)  # drained
    assert h.backend.running_jobs(h.plain_gpu.host) == 0


# --- MIG mode ---------------------------------------------------------------------------------


def test_mig_mode_on_an_idle_gpu_takes_effect_at_once(h: Harness) -> None:
    ref = h.plain_gpu
    h.backend.set_mig_mode(ref.host, ref.uuid, True)
    g = h.gpu(ref)
    assert (g.mig_current, g.mig_pending, g.mig_devices) == (True, True, ())
    h.backend.set_mig_layout(ref.host, ref.uuid, {"3g.40gb": 2})
    h.backend.set_mig_mode(ref.host, ref.uuid, True)  # the same mode again changes nothing
    assert h.gpu(ref).layout_counts() == {"3g.40gb": 2}
    h.backend.set_mig_mode(ref.host, ref.uuid, False)  # disabling drops every instance
    g = h.gpu(ref)
    assert (g.mig_current, g.mig_pending, g.mig_devices) == (False, False, ())
    h.backend.set_mig_mode(ref.host, ref.uuid, False)
    assert h.gpu(ref) == g


def test_mig_mode_on_a_busy_gpu_is_in_use_and_stays_pending(h: Harness) -> None:
    ref = h.plain_gpu
    h.set_busy(ref, 1)
    with pytest.raises(GpuInUseError, match=ref.uuid):
        h.backend.set_mig_mode(ref.host, ref.uuid, True)
    g = h.gpu(ref)
    assert (g.mig_current, g.mig_pending) == (False, True)  # observable, so plan shows the pending reset
    with pytest.raises(BackendError, match=ref.uuid) as exc:
        h.backend.set_mig_layout(ref.host, ref.uuid, {"7g.80gb": 1})
    assert type(exc.value) is BackendError  # not usable until the reset, whoever runs on it
    h.set_busy(ref, 0)
    h.backend.set_mig_mode(ref.host, ref.uuid, True)
    g = h.gpu(ref)
    assert (g.mig_current, g.mig_pending) == (True, True)


def test_disabling_mig_on_a_busy_gpu_is_in_use_and_keeps_the_layout(h: Harness) -> None:
    ref = h.mig_gpu
    before = h.gpu(ref)
    h.set_busy(ref, 1)
    with pytest.raises(GpuInUseError, match=ref.uuid):
        h.backend.set_mig_mode(ref.host, ref.uuid, False)
    # Refused before anything changed: instances go before the mode, and they cannot while in use.
    assert h.gpu(ref) == dataclasses.replace(before, processes=1)
    h.backend.set_mig_mode(ref.host, ref.uuid, True)  # the mode it has: a no-op, busy or not
    assert h.gpu(ref) == dataclasses.replace(before, processes=1)


def test_cancelling_a_pending_mode_change_needs_no_reset(h: Harness) -> None:
    ref = h.plain_gpu
    h.set_busy(ref, 1)
    with pytest.raises(GpuInUseError):
        h.backend.set_mig_mode(ref.host, ref.uuid, True)
    assert (h.gpu(ref).mig_current, h.gpu(ref).mig_pending) == (False, True)
    h.backend.set_mig_mode(ref.host, ref.uuid, False)  # back to the current mode: nothing to reset
    g = h.gpu(ref)
    assert (g.mig_current, g.mig_pending, g.processes) == (False, False, 1)


def test_mig_mode_on_a_model_without_mig_is_a_backend_error(h: Harness) -> None:
    ref = h.no_mig_gpu
    before = h.gpu(ref)
    for enabled in (True, False):
        with pytest.raises(BackendError) as exc:
            h.backend.set_mig_mode(ref.host, ref.uuid, enabled)
        assert type(exc.value) is BackendError and "MIG is not supported" in str(exc.value)
        assert ref.uuid in str(exc.value)
    assert h.gpu(ref) == before


# --- MIG layout -------------------------------------------------------------------------------

LEGAL = [{"1g.10gb": 7}, {"3g.40gb": 2}, {"7g.80gb": 1}, {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
         {"1g.20gb": 2, "3g.40gb": 1}, {}]


def _legal_placements(model: str, g: GpuInfo) -> None:
    m = gpu_model(model)
    used: set[int] = set()
    for d in g.mig_devices:
        p = m.profile(d.profile)
        assert d.start in p.starts, f"{d.profile} cannot start at memory slice {d.start}"
        span = set(range(d.start, d.start + p.memory_slices))
        assert not used & span, f"{d.profile}@{d.start} overlaps another instance"
        used |= span


@pytest.mark.parametrize("layout", LEGAL, ids=lambda lay: "+".join(f"{c}x{p}" for p, c in lay.items()) or "empty")
def test_legal_layout_is_applied_all_or_nothing(h: Harness, layout: dict[str, int]) -> None:
    ref = h.mig_gpu
    node_before = h.backend.node(ref.host)
    old = {d.uuid for d in h.gpu(ref).mig_devices}
    info = h.backend.set_mig_layout(ref.host, ref.uuid, layout)
    assert isinstance(info, GpuInfo) and info.uuid == ref.uuid
    assert info.layout_counts() == {p: c for p, c in layout.items() if c}
    assert (info.mig_current, info.mig_pending) == (True, True)
    uuids = [d.uuid for d in info.mig_devices]
    assert len(set(uuids)) == len(uuids) == sum(layout.values())
    assert all(u.startswith("MIG-") for u in uuids) and not old & set(uuids)  # every instance recreated
    _legal_placements(info.model, info)
    after = h.backend.node(ref.host)
    assert h.gpu(ref) == info  # what apply returned is what the next refresh reads
    assert [g for g in after.gpus if g.uuid != ref.uuid] == [g for g in node_before.gpus if g.uuid != ref.uuid]
    assert after.fingerprint() != node_before.fingerprint()


def test_applying_the_same_layout_again_recreates_it(h: Harness) -> None:
    ref = h.mig_gpu
    first = h.gpu(ref)
    again = h.backend.set_mig_layout(ref.host, ref.uuid, BALANCED)
    assert again.layout_counts() == BALANCED
    assert not {d.uuid for d in first.mig_devices} & {d.uuid for d in again.mig_devices}


ILLEGAL = {
    "too-many": {"1g.10gb": 8},
    "no-placement": {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1},
    "too-many-compute": {"3g.40gb": 2, "2g.20gb": 1},
    "unknown-profile": {"1g.5gb": 1},
    "negative-count": {"1g.10gb": -1},
    "non-integer-count": {"1g.10gb": 1.5},
}


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("name", sorted(ILLEGAL))
def test_illegal_layout_is_a_backend_error_and_changes_nothing(h: Harness, name: str, busy: bool) -> None:
    ref = h.mig_gpu
    if busy:
        h.set_busy(ref, 1)
    before = h.backend.inventory()
    with pytest.raises(BackendError) as exc:
        h.backend.set_mig_layout(ref.host, ref.uuid, ILLEGAL[name])  # type: ignore[arg-type]
    assert type(exc.value) is BackendError  # illegal whether or not the GPU is busy
    assert ref.uuid in str(exc.value)  # the message says which GPU
    assert h.backend.inventory() == before


@pytest.mark.parametrize("which", ["plain_gpu", "no_mig_gpu"])
def test_layout_needs_mig_on(h: Harness, which: str) -> None:
    ref: GpuRef = getattr(h, which)
    before = h.backend.inventory()
    with pytest.raises(BackendError, match=ref.uuid) as exc:
        h.backend.set_mig_layout(ref.host, ref.uuid, {"1g.10gb": 1})
    assert type(exc.value) is BackendError
    assert h.backend.inventory() == before


def test_legal_layout_on_a_busy_gpu_is_in_use_and_changes_nothing(h: Harness) -> None:
    ref = h.mig_gpu
    h.set_busy(ref, 1)
    before = h.backend.inventory()
    with pytest.raises(GpuInUseError, match=ref.uuid):
        h.backend.set_mig_layout(ref.host, ref.uuid, {"7g.80gb": 1})
    assert h.backend.inventory() == before


def test_gpu_that_cannot_be_reset_in_place_needs_a_reset(h: Harness) -> None:
    if h.block_reset is None:
        pytest.skip(f"{h.backend.name} cannot model a GPU without in-place reset")
    ref = h.plain_gpu
    h.block_reset(ref)
    with pytest.raises(ResetRequiredError, match=ref.uuid):
        h.backend.set_mig_mode(ref.host, ref.uuid, True)
    g = h.gpu(ref)
    assert (g.mig_current, g.mig_pending) == (False, True)


def test_layout_failing_midway_leaves_no_mig_devices(h: Harness) -> None:
    if h.fail_layout_create is None:
        pytest.skip(f"{h.backend.name} cannot model a failure while creating MIG instances")
    ref = h.mig_gpu
    heal = h.fail_layout_create(ref)
    with pytest.raises(BackendError, match=ref.uuid) as exc:
        h.backend.set_mig_layout(ref.host, ref.uuid, {"1g.10gb": 7})
    assert type(exc.value) is BackendError and "no MIG devices" in str(exc.value)
    g = h.gpu(ref)  # mig-parted's behaviour: never a half-built layout that looks finished
    assert (g.mig_current, g.mig_devices) == (True, ())
    heal()
    assert h.backend.set_mig_layout(ref.host, ref.uuid, {"1g.10gb": 7}).layout_counts() == {"1g.10gb": 7}


# --- unknown and unreachable nodes, unknown GPUs ------------------------------------------------


def test_unknown_node_is_a_backend_error_naming_it(h: Harness) -> None:
    host, uuid = "no-such-node", h.mig_gpu.uuid
    calls: list[Callable[[], object]] = [
        lambda: h.backend.node(host),
        lambda: h.backend.cordon(host, True),
        lambda: h.backend.running_jobs(host),
        lambda: h.backend.set_mig_mode(host, uuid, True),
        lambda: h.backend.set_mig_layout(host, uuid, {"7g.80gb": 1}),
    ]
    before = h.backend.inventory()
    for call in calls:
        with pytest.raises(BackendError, match=host):
            call()
    assert h.backend.inventory() == before


def test_unknown_gpu_is_a_backend_error_naming_it(h: Harness) -> None:
    host, uuid = h.mig_gpu.host, "GPU-00000000-0000-0000-0000-000000000000"
    before = h.backend.inventory()
    with pytest.raises(BackendError, match=uuid):
        h.backend.set_mig_mode(host, uuid, True)
    with pytest.raises(BackendError, match=uuid):
        h.backend.set_mig_layout(host, uuid, {"7g.80gb": 1})
    assert h.backend.inventory() == before


def test_unreachable_node_is_listed_empty_and_refuses_every_call(h: Harness) -> None:
    if h.set_reachable is None:
        pytest.skip(f"{h.backend.name} cannot model an unreachable node")
    host, uuid = h.mig_gpu.host, h.mig_gpu.uuid
    before = h.backend.node(host)
    h.set_reachable(host, False)
    listed = next(n for n in h.backend.inventory() if n.hostname == host)
    assert (listed.reachable, listed.gpus) == (False, ())
    for call in (lambda: h.backend.node(host), lambda: h.backend.cordon(host, True),
                 lambda: h.backend.running_jobs(host),
                 lambda: h.backend.set_mig_mode(host, uuid, False),
                 lambda: h.backend.set_mig_layout(host, uuid, {"7g.80gb": 1})):
        with pytest.raises(BackendError, match=host):
            call()
    h.set_reachable(host, True)
    assert h.backend.node(host) == before


# --- telemetry and health (optional methods) -------------------------------------------------------


def _telemetry(h: Harness) -> list[dict[str, Any]]:
    fn = getattr(h.backend, "telemetry", None)
    if fn is None:
        pytest.skip(f"{h.backend.name} has no telemetry() (optional)")
    rows: list[dict[str, Any]] = fn()
    return rows


def _health_events(h: Harness) -> Callable[[], list[tuple[str, str]]]:
    fn = getattr(h.backend, "health_events", None)
    if fn is None:
        pytest.skip(f"{h.backend.name} has no health_events() (optional)")
    return fn


def test_telemetry_keys_and_units(h: Harness) -> None:
    h.set_busy(h.plain_gpu, 2)
    rows = _telemetry(h)
    gpus = {g.uuid: (n.hostname, g) for n in _reachable(h.backend.inventory()) for g in n.gpus}
    assert sorted(r["uuid"] for r in rows) == sorted(gpus)
    for r in rows:
        assert set(TELEMETRY_KEYS) <= set(r) and "error" not in r
        host, g = gpus[r["uuid"]]
        assert (r["hostname"], r["index"], r["healthy"]) == (host, g.index, True)
        assert r["memory_total_mib"] == g.memory_mib  # MiB, as the inventory
        assert isinstance(r["memory_used_mib"], int) and 0 <= r["memory_used_mib"] <= g.memory_mib
        if g.mig_current:
            assert r["utilization_gpu"] is None  # NVML cannot read it on a MIG-enabled GPU
        else:
            assert isinstance(r["utilization_gpu"], int) and 0 <= r["utilization_gpu"] <= 100  # percent
        assert r["temperature_c"] is None or 0 <= r["temperature_c"] < 150  # degrees Celsius
        assert r["power_w"] is None or 0 < r["power_w"] < 2000  # watts, not milliwatts
        assert r["ecc_double_bit"] is None or (isinstance(r["ecc_double_bit"], int) and r["ecc_double_bit"] >= 0)
        assert isinstance(r["processes"], list) and len(r["processes"]) == g.processes
        assert all(set(p) == {"pid", "used_memory_mib"} for p in r["processes"])
    assert gpus[h.plain_gpu.uuid][1].processes == 2


def test_no_health_events_on_a_healthy_fleet(h: Harness) -> None:
    events = _health_events(h)
    assert events() == [] and events() == []
    assert all(g.healthy for n in _reachable(h.backend.inventory()) for g in n.gpus)


def test_xid_is_reported_once_and_marks_the_gpu_unhealthy(h: Harness) -> None:
    events = _health_events(h)
    if h.inject_xid is None:
        pytest.skip(f"{h.backend.name} cannot model an Xid")
    assert events() == []
    h.inject_xid(h.mig_gpu, 79)
    h.inject_xid(h.plain_gpu, 13)  # an application's fault, not the GPU's
    got = events()
    assert [u for u, _ in got] == [h.mig_gpu.uuid] and "Xid 79" in got[0][1]
    assert events() == []
    assert not h.gpu(h.mig_gpu).healthy and h.gpu(h.plain_gpu).healthy
    rows = {r["uuid"]: r for r in _telemetry(h)}
    assert rows[h.mig_gpu.uuid]["healthy"] is False and rows[h.plain_gpu.uuid]["healthy"] is True


def test_new_double_bit_ecc_error_is_a_health_event(h: Harness) -> None:
    events = _health_events(h)
    if h.inject_ecc is None:
        pytest.skip(f"{h.backend.name} cannot model an ECC error")
    assert events() == []
    h.inject_ecc(h.plain_gpu)
    got = events()
    assert got and {u for u, _ in got} == {h.plain_gpu.uuid} and all("ECC" in why for _, why in got)
    assert events() == []
    assert not h.gpu(h.plain_gpu).healthy and h.gpu(h.mig_gpu).healthy


# --- jobs on the devices the backend reports ----------------------------------------------------

_SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) "
             "for k in ('CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES')}))")


def _allocations(h: Harness) -> list[list[str]]:
    """What the scheduler hands a job: one MIG instance, a whole GPU, and both of one node's kinds."""
    mig = h.gpu(h.mig_gpu).mig_devices
    return [[mig[0].uuid], [h.plain_gpu.uuid], [h.plain_gpu.uuid, h.no_mig_gpu.uuid], [d.uuid for d in mig]]


def test_jobs_see_exactly_the_allocated_uuids(h: Harness, tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path / "logs")
    for i, devices in enumerate(_allocations(h)):
        job = ex.launch(f"env-{i}", [sys.executable, "-c", _SHOW_ENV], devices)
        assert ex.wait(job, 30) == 0
        seen = json.loads(next(ln for ln in job.log_path.read_text().splitlines() if ln.startswith("{")))
        assert seen == {"CUDA_VISIBLE_DEVICES": ",".join(devices), "NVIDIA_VISIBLE_DEVICES": ",".join(devices)}


def test_job_exit_codes_and_cancel(h: Harness, tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path / "logs")
    devices = [h.gpu(h.mig_gpu).mig_devices[0].uuid]
    failed = ex.launch("fails", [sys.executable, "-c", "raise SystemExit(3)"], devices)
    polite = ex.launch("polite", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                       devices)
    stubborn_code = textwrap.dedent("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('up', flush=True)
        time.sleep(60)
    """)
    stubborn = ex.launch("stubborn", [sys.executable, "-c", stubborn_code], [h.plain_gpu.uuid])
    assert ex.wait(failed, 30) == 3
    for job in (polite, stubborn):
        _wait_for_line(job.log_path, "up")
    assert ex.stop(polite, grace_s=10) == -15  # SIGTERM ends it within the grace period
    assert ex.stop(stubborn, grace_s=0.3) == -9  # ignored SIGTERM: SIGKILL after the grace period


def test_running_job_is_readopted_after_a_restart(h: Harness, tmp_path: Path) -> None:
    devices = [d.uuid for d in h.gpu(h.mig_gpu).mig_devices[:2]]
    ex = LocalExecutor(tmp_path / "logs")
    job = ex.launch("long", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], devices)
    _wait_for_line(job.log_path, "up")
    # A restarted service: a new executor (not the job's parent) and a new backend object.
    ex2 = LocalExecutor(tmp_path / "logs")
    backend2 = h.reopen()
    adopted = ex2.adopt(job.pid, job.start_time)
    assert adopted is not None and adopted.exit_file == job.exit_file and adopted.job_id == "long"
    live = {d.uuid for n in _reachable(backend2.inventory()) for g in n.gpus for d in g.mig_devices}
    assert set(devices) <= live  # the stored allocation still names live devices
    assert ex2.poll(adopted) is None
    assert ex2.stop(adopted, grace_s=10) == -15
    assert ex.poll(job) == -15  # the first executor (the parent) reaps the same status


def _wait_for_line(path: Path, text: str, timeout_s: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text().splitlines():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}")
