"""End-to-end checks of the NVML backend on a machine with an NVIDIA GPU (``scripts/gpu_check.sh``).

Read-only: nothing here changes MIG mode or layout. Each test skips with a message
where NVML cannot initialise (see ``conftest.py``).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from rlsched.runtime.nvml_backend import NvmlBackend

pytestmark = pytest.mark.gpu


def _bare(uuid: str) -> str:
    """A GPU or MIG UUID without its prefix, lower case (CUDA reports the bare UUID)."""
    for prefix in ("GPU-", "MIG-"):
        if uuid.startswith(prefix):
            uuid = uuid[len(prefix):]
    return uuid.lower()


def test_inventory_and_mig_mode_per_gpu(nvml: NvmlBackend) -> None:
    (node,) = nvml.inventory()
    nv = nvml._nvml
    for g in node.gpus:
        assert g.uuid.startswith("GPU-") and g.memory_mib > 0 and g.name, g
        handle = nv.nvmlDeviceGetHandleByIndex(g.index)
        try:
            current, pending = nv.nvmlDeviceGetMigMode(handle)
            mode = f"current={current} pending={pending}"
            assert (current == nv.NVML_DEVICE_MIG_ENABLE) == g.mig_current
        except nv.NVMLError_NotSupported:
            mode = "not supported"
            assert not g.mig_current
        print(f"GPU {g.index} {g.uuid} {g.name} [{g.model or 'unknown model'}] MIG {mode} "
              f"devices={[d.uuid for d in g.mig_devices]}")
        for d in g.mig_devices:
            assert d.uuid.startswith("MIG-") and "g." in d.profile


def test_telemetry_and_health(nvml: NvmlBackend) -> None:
    rows = nvml.telemetry()
    print(json.dumps(rows, indent=1))
    assert rows and all("error" not in r for r in rows), rows
    for r in rows:
        assert r["memory_total_mib"] > 0 and 0 <= r["memory_used_mib"] <= r["memory_total_mib"]
        assert r["utilization_gpu"] is None or 0 <= r["utilization_gpu"] <= 100
        assert r["power_w"] is None or 0 < r["power_w"] < 2000  # watts, not milliwatts
    events = nvml.health_events(timeout_ms=100)
    print("health events:", events, "events unsupported on GPU indices:", nvml.events_unsupported)
    assert isinstance(events, list)


_JOB = textwrap.dedent("""
    import os, torch
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    print("CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"])
    print("device_count=%d" % torch.cuda.device_count())
    print("name=" + torch.cuda.get_device_name(0))
    print("uuid=%s" % torch.cuda.get_device_properties(0).uuid)
""")


def test_executor_job_sees_exactly_the_allocated_device(nvml: NvmlBackend, tmp_path: Path) -> None:
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU-only build")
    from rlsched.runtime.executor import LocalExecutor

    gpu = nvml.inventory()[0].gpus[0]
    device = gpu.mig_devices[0].uuid if gpu.mig_devices else gpu.uuid
    ex = LocalExecutor(tmp_path / "logs")
    job = ex.launch("gpu-check", [sys.executable, "-c", _JOB], [device])
    code = ex.wait(job, timeout_s=180)
    log = job.log_path.read_text()
    print(log)
    assert code == 0, f"job exited {code}:\n{log}"
    out = dict(line.split("=", 1) for line in log.splitlines() if "=" in line and not line.startswith("==="))
    assert out["CUDA_VISIBLE_DEVICES"] == device
    assert out["device_count"] == "1"
    assert _bare(out["uuid"]) == _bare(device), f"torch sees {out['uuid']}, allocated {device}"
