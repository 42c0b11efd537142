"""The live service places gangs by the pool's HCL ``gang`` attribute, as the simulator does.

``rlsched simulate --pools`` and the service both build their pools with
``rlsched.spec.to_pool_specs``; this pins that the service's live view keeps the
declared gang mode, so a 16-GPU job on partly used nodes waits for two whole nodes
under ``whole-nodes`` (the default) and is spread under ``packed``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.cluster.feasibility import gang_candidate
from rlsched.cluster.job import Job
from rlsched.cluster.model import GangMode, JobRun, Placement
from rlsched.runtime.sim_backend import SimulatedBackend, build_fleet, write_json_atomic
from rlsched.service.view import build_view
from rlsched.spec import load_spec

SPEC = '''pool "train" {{
  gpu_model = "H100-80GB"
  nodes     = ["gpu-h100-01", "gpu-h100-02", "gpu-h100-03"]
{gang}}}
'''


@pytest.mark.parametrize(("gang", "mode"), [("", GangMode.WHOLE_NODES), ('  gang      = "packed"\n', GangMode.PACKED)])
def test_live_view_follows_the_declared_gang_mode(tmp_path: Path, gang: str, mode: GangMode) -> None:
    fleet = tmp_path / "fleet.json"
    write_json_atomic(fleet, build_fleet("3x8xH100-80GB"))
    (tmp_path / "pool.hcl").write_text(SPEC.format(gang=gang))
    spec = load_spec(tmp_path / "pool.hcl", env={})
    view = build_view(spec, SimulatedBackend(fleet).inventory(), (), (), 0.0)
    pool = view.state.pools["train"]
    assert pool.spec.gang is mode
    # 6 + 5 + 5 free GPUs: a 16-GPU gang fits only when it may spread over partly used nodes
    for k, node in enumerate(pool.nodes.values()):
        for gi in range(2 if k == 0 else 3):
            view.state.allocate(JobRun(Job(f"busy-{k}-{gi}", 0.0, 100.0)), Placement("train", ((node.id, gi),)))
    placed = gang_candidate(pool, Job("g", 0.0, 10.0, num_gpus=16), 0.0)
    assert (placed is not None) is (mode is GangMode.PACKED)
