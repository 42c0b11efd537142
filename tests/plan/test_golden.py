"""Golden tests: the rendered plan of every ``configs/*.hcl`` example (and a day-2 scenario) against a sim fleet.

Regenerate after an intended rendering change with ``RLSCHED_UPDATE_GOLDENS=1 pytest tests/plan/test_golden.py``
and review the diff. The fleet is built from each spec's own node names, with the sim
backend's deterministic GPU UUIDs, so the output is stable.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import POOL_HCL, Workspace, needs_real

pytestmark = needs_real

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
CONFIGS = sorted((ROOT / "configs").glob("*.hcl"))


def fleet_for(spec_path: Path, out: Path) -> None:
    """A fleet holding exactly the nodes the spec names, each with its pool's model and GPU count."""
    from rlsched.cluster.catalog import resolve_model_name
    from rlsched.runtime.sim_backend import build_fleet, gpu_uuid_for, write_json_atomic
    from rlsched.spec import load_spec

    spec = load_spec([spec_path])
    doc: dict = {"version": 1, "nodes": []}
    for pool in sorted(spec.pools.values(), key=lambda p: p.name):
        model = resolve_model_name(pool.gpu_model) or pool.gpu_model
        for host in pool.nodes:
            node = build_fleet(f"1x{pool.gpus_per_node or 8}x{model}")["nodes"][0]
            node["hostname"] = host
            for g in node["gpus"]:
                g["uuid"] = gpu_uuid_for(host, g["index"])
            doc["nodes"].append(node)
    write_json_atomic(out, doc)


def check(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("RLSCHED_UPDATE_GOLDENS") or not path.exists():
        if not os.environ.get("RLSCHED_UPDATE_GOLDENS"):
            pytest.fail(f"no golden {path.name}; run with RLSCHED_UPDATE_GOLDENS=1 to create it")
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.skipif(not CONFIGS, reason="no configs/*.hcl yet")
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_plan_golden(tmp_path: Path, config: Path) -> None:
    w = Workspace(tmp_path)
    fleet_for(config, w.fleet)
    p = w.run("plan", str(config), "--state", str(tmp_path / "s.json"))
    assert p.returncode == 0, p.stderr
    check(f"config-{config.stem}", p.stdout)


def test_day2_plan_golden(tmp_path: Path) -> None:
    """After an apply: a layout change, a quota change, drift on one GPU, jobs on a node, a node unreachable."""
    w = Workspace(tmp_path, drain="5m")
    assert w.run("apply", str(w.spec), "--auto-approve").returncode == 0
    w.spec.write_text(POOL_HCL.replace('"1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1', '"3g.40gb" = 2')
                      .replace('max_slices = { "1g.10gb" = 4 }', 'max_slices = { "3g.40gb" = 2 }')
                      % {"drain": "5m"})
    be = w.backend()
    g = be.node("gpu-h100-02").gpus[1]
    be.set_mig_layout("gpu-h100-02", g.uuid, {"1g.10gb": 7})
    be.set_processes("gpu-h100-02", be.node("gpu-h100-02").gpus[0].uuid, 3)
    be.set_reachable("gpu-h100-03", False)
    p = w.run("plan", str(w.spec), "--out", "day2.rlplan")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1].startswith("Saved day2.rlplan (lineage ")
    check("day2", "\n".join(lines[:-1]) + "\n")
