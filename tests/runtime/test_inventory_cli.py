"""``rlsched inventory init|show`` and ``rlsched export`` through a real subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import hcl2
import pytest
import yaml

from rlsched.runtime.backend import GpuInUseError
from rlsched.runtime.sim_backend import SimulatedBackend, read_fleet, write_json_atomic

from .conftest import run_cli


def test_init_then_show(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    proc = run_cli("inventory", "init", "--nodes", "4x8xH100-80GB,2x8xA100-80GB", "--mig", "balanced",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "6 nodes, 48 GPUs" in proc.stdout
    data = read_fleet(out)
    assert [n["hostname"] for n in data["nodes"]][:2] == ["gpu-h100-01", "gpu-h100-02"]
    assert data["nodes"][4]["hostname"] == "gpu-a100-01"
    assert data["nodes"][4]["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"

    proc = run_cli("inventory", "show", "--backend", f"sim:{out}")
    assert proc.returncode == 0, proc.stderr
    assert "gpu-h100-04" in proc.stdout and "NVIDIA H100 80GB HBM3" in proc.stdout
    assert "1g.10gbx2 2g.20gb 3g.40gb" in proc.stdout
    assert "6 nodes, 48 GPUs" in proc.stdout


def test_show_json_and_env_default(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    assert run_cli("inventory", "init", "--nodes", "1x2xH200", "--out", str(out)).returncode == 0
    be = SimulatedBackend(out)
    gpu = be.node("gpu-h200-01").gpus[1]
    be.set_processes("gpu-h200-01", gpu.uuid, 3)
    be.set_mig_mode("gpu-h200-01", be.node("gpu-h200-01").gpus[0].uuid, True)
    proc = run_cli("inventory", "show", "--json", env={"RLSCHED_BACKEND": f"sim:{out}"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == f"sim:{out}"
    (node,) = doc["nodes"]
    assert node["hostname"] == "gpu-h200-01" and len(node["fingerprint"]) == 16
    g0, g1 = node["gpus"]
    assert (g0["name"], g0["model"], g0["memory_mib"], g0["mig_current"]) == ("NVIDIA H200", "H200-141GB", 143771, True)
    assert g1["processes"] == 3 and g1["mig_devices"] == []


def test_show_marks_pending_and_unreachable(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    assert run_cli("inventory", "init", "--nodes", "2x1xA100-40GB", "--out", str(out)).returncode == 0
    be = SimulatedBackend(out)
    g = be.node("gpu-a100-01").gpus[0]
    be.set_processes("gpu-a100-01", g.uuid, 1)
    with pytest.raises(GpuInUseError):  # the mode stays pending, which show must render
        be.set_mig_mode("gpu-a100-01", g.uuid, True)
    be.set_reachable("gpu-a100-02", False)
    proc = run_cli("inventory", "show", "--backend", f"sim:{out}")
    assert proc.returncode == 0, proc.stderr
    assert "off -> on (pending reset)" in proc.stdout
    assert "unreachable" in proc.stdout and "1 unreachable" in proc.stdout


def test_init_refuses_to_overwrite_and_bad_specs(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    assert run_cli("inventory", "init", "--nodes", "1x1xH100-80GB", "--out", str(out)).returncode == 0
    proc = run_cli("inventory", "init", "--nodes", "1x1xH100-80GB", "--out", str(out))
    assert proc.returncode == 1 and "pass --force" in proc.stderr
    assert run_cli("inventory", "init", "--nodes", "1x1xH100-80GB", "--out", str(out), "--force").returncode == 0
    proc = run_cli("inventory", "init", "--nodes", "2xH100", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 1 and proc.stderr.startswith("error: --nodes: cannot parse '2xH100'")
    proc = run_cli("inventory", "init", "--nodes", "1x1xH100-80GB", "--mig", "all-9g",
                   "--out", str(tmp_path / "y.json"))
    assert proc.returncode == 1 and "error: --mig all-9g" in proc.stderr
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()


def test_backend_errors_are_one_line(tmp_path: Path) -> None:
    proc = run_cli("inventory", "show")
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no GPU backend chosen") and "Traceback" not in proc.stderr
    proc = run_cli("inventory", "show", "--backend", f"sim:{tmp_path / 'nope.json'}")
    assert proc.returncode == 1 and "rlsched inventory init" in proc.stderr
    proc = run_cli("inventory", "show", "--backend", "slurm")
    assert proc.returncode == 1 and "unknown backend 'slurm'" in proc.stderr


def test_export_hcl_and_mig_parted_files(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.json"
    assert run_cli("inventory", "init", "--nodes", "2x8xH100-80GB:balanced,1x8xA100-80GB", "--out",
                   str(fleet)).returncode == 0
    hcl_out = tmp_path / "pool.hcl"
    proc = run_cli("export", "--backend", f"sim:{fleet}", "--out", str(hcl_out))
    assert proc.returncode == 0, proc.stderr
    doc = hcl2.loads(hcl_out.read_text())
    pools = {k.strip('"'): v for p in doc["pool"] for k, v in p.items()}
    assert pools["h100_80gb_balanced"]["nodes"] == ['"gpu-h100-01"', '"gpu-h100-02"']
    assert pools["a100_80gb"]["mig"] == '"disabled"'
    proc = run_cli("export", "--backend", f"sim:{fleet}", "--format", "mig-parted")
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["version"] == "v1"
    assert cfg["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert cfg["mig-configs"]["all-balanced"][0]["mig-devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


def test_failure_injected_in_the_file_surfaces_through_the_cli(tmp_path: Path) -> None:
    """Faults live in the fleet file, so a CLI process sees them (as apply will)."""
    fleet = tmp_path / "fleet.json"
    assert run_cli("inventory", "init", "--nodes", "1x1xH100-80GB", "--out", str(fleet)).returncode == 0
    data = read_fleet(fleet)
    data["nodes"][0]["reachable"] = False
    write_json_atomic(fleet, data)
    proc = run_cli("export", "--backend", f"sim:{fleet}")
    assert proc.returncode == 0
    assert "warning: gpu-h100-01 not exported: unreachable" in proc.stderr
    assert "# not exported: gpu-h100-01" in proc.stdout
