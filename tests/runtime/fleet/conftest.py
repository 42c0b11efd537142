"""A real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``) for the fleet tests.

A CPU-only head (labelled ``rlsched/agent=false``: it gets no agent) and three worker nodes, each with
its own simulated fleet file and agent state dir, given to its agent through the node's environment as
on a real cluster: ``a`` and ``b`` hold 4 whole A100s each, ``c`` 2 H100s split by the balanced MIG
layout. One cluster per test module (a few seconds to start); tests that kill a node put it back.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rlsched.runtime.sim_backend import build_fleet, write_json_atomic
from tests.service.serving import wait_for

__all__ = ["PY", "RayFleet", "alive", "ray_cluster", "wait_for"]

PY = sys.executable
FLEETS = {"a": "1x4xA100-80GB", "b": "1x4xA100-80GB", "c": "1x2xH100-80GB:balanced"}

SPEC = """
mig_layout "balanced" {
  devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }
}

pool "train" {
  gpu_model     = "A100-80GB"
  nodes         = ["%(a)s", "%(b)s"]
  gpus_per_node = 4
  mig           = "disabled"
  gang          = "packed"
}

pool "mig" {
  gpu_model     = "H100-80GB"
  nodes         = ["%(c)s"]
  gpus_per_node = 2
  mig_layout    = mig_layout.balanced
}

policy "default" {
  scheduler = "fifo"
  fallback  = "fifo"
}
"""

RESPLIT = """
mig_layout "all1g" {
  devices = { "1g.10gb" = 7 }
}

pool "train" {
  gpu_model     = "A100-80GB"
  nodes         = ["%(a)s"]
  gpus_per_node = 4
  mig           = "disabled"
}

pool "migb" {
  gpu_model     = "A100-80GB"
  nodes         = ["%(b)s"]
  gpus_per_node = 4
  mig_layout    = mig_layout.all1g
}

pool "mig" {
  gpu_model     = "H100-80GB"
  nodes         = ["%(c)s"]
  gpus_per_node = 2
  mig_layout    = mig_layout.all1g
}
"""


@dataclass
class RayFleet:
    """The cluster, its address, and per Ray node: fleet file, rlsched hostname, agent state dir."""

    cluster: Any
    address: str
    root: Path
    fleets: dict[str, Path]
    hosts: dict[str, str]
    nodes: dict[str, Any] = field(default_factory=dict)

    def env(self, label: str) -> dict[str, str]:
        return {"RLSCHED_AGENT_BACKEND": f"sim:{self.fleets[label]}",
                "RLSCHED_AGENT_STATE_DIR": str(self.root / f"agent-{label}")}

    def add(self, label: str, env: dict[str, str] | None = None) -> Any:
        node = self.cluster.add_node(num_cpus=1, env_vars=env or self.env(label))
        self.nodes[label] = node
        return node

    def remove(self, label: str) -> None:
        self.cluster.remove_node(self.nodes.pop(label))

    def spec(self, path: Path, resplit: bool = False) -> Path:
        """The pools file; ``resplit``: node b becomes a MIG pool and both MIG nodes take all-1g layouts."""
        path.write_text(RESPLIT % self.hosts if resplit else SPEC % self.hosts)
        return path


def ray_cluster() -> contextlib.AbstractContextManager[Any]:
    """A Ray cluster on this machine with a CPU-only head that gets no agent (add worker nodes to it)."""
    from tests.raycluster import ray_cluster as cluster

    return cluster(head_labels={"rlsched/agent": "false"})


@pytest.fixture(scope="module")
def ray_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayFleet]:
    root = tmp_path_factory.mktemp("rayfleet")
    fleets, hosts = {}, {}
    for label, groups in FLEETS.items():
        data = build_fleet(groups, hostname_prefix=label)
        fleets[label] = root / f"fleet-{label}.json"
        write_json_atomic(fleets[label], data)
        hosts[label] = data["nodes"][0]["hostname"]
    with ray_cluster() as cluster:
        fleet = RayFleet(cluster, cluster.address, root, fleets, hosts)
        for label in FLEETS:
            fleet.add(label)
        cluster.wait_for_nodes()
        yield fleet


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    from rlsched.posix import process_state

    return process_state(pid) not in (None, "Z", "X")
