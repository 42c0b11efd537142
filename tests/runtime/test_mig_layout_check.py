"""The NVML and simulated backends check a requested MIG layout with the same rule and the same words."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.runtime.backend import BackendError
from rlsched.runtime.nvml_backend import NvmlBackend
from rlsched.runtime.sim_backend import SimulatedBackend, build_fleet, write_json_atomic

from .fake_pynvml import FakeGpu, FakeNvml

FITS: list[dict[str, int]] = [
    {"1g.10gb": 7},
    {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    {"4g.40gb": 1, "3g.40gb": 1},
    {"7g.80gb": 1, "1g.10gb": 0},
]
REFUSED: list[dict[str, int]] = [
    {"1g.10gb": 8},  # one more than fits
    {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1},  # 8 compute slices
    {"3g.40gb": 3},  # over the profile's maximum
    {"1g.5gb": 1},  # not an H100 profile
    {"1g.10gb": -1},  # a negative count
    {"2g.20gb": True},  # a bool is not a count
]


def _outcome(set_layout: object, gpu: str, devices: dict[str, int]) -> tuple[str, object]:
    """``("ok", sorted (profile, start))`` or ``("refused", the message after the prefix naming the GPU)``."""
    try:
        info = set_layout(devices)  # type: ignore[operator]
    except BackendError as exc:
        where, _, why = str(exc).partition(": ")
        assert gpu in where, str(exc)
        return "refused", why
    return "ok", sorted((d.profile, d.start) for d in info.mig_devices)


@pytest.mark.parametrize("devices", FITS + REFUSED, ids=lambda d: "+".join(f"{c}x{p}" for p, c in d.items()))
def test_both_backends_accept_and_refuse_the_same_layouts(tmp_path: Path, devices: dict[str, int]) -> None:
    fleet = tmp_path / "fleet.json"
    write_json_atomic(fleet, build_fleet("1x1xH100-80GB:all-7g"))
    sim = SimulatedBackend(fleet)
    (node,) = sim.inventory()
    sim_gpu = node.gpus[0]
    nvml = NvmlBackend(nvml=FakeNvml([FakeGpu("H100-80GB", mig_current=True)]), hostname="node-a")
    nvml_gpu = nvml.node("node-a").gpus[0]
    assert sim_gpu.name == nvml_gpu.name  # the same marketing name, so the same messages
    got_sim = _outcome(lambda d: sim.set_mig_layout(node.hostname, sim_gpu.uuid, d), f"{node.hostname}/0", devices)
    got_nvml = _outcome(lambda d: nvml.set_mig_layout("node-a", nvml_gpu.uuid, d), "node-a/0", devices)
    assert got_sim == got_nvml
    assert got_sim[0] == ("ok" if devices in FITS else "refused")
