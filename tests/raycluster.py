"""A real multi-node Ray cluster on this machine for tests (``ray.cluster_utils.Cluster``), shared by the
fleet runtime's tests and the Ray training tests.

Two things every such cluster must do, written once here:

* this process leaves any cluster it was connected to first (``rlsched.ray_connect`` keeps one
  connection per process), and this one at the end;
* ``Cluster()`` points this machine's ``ray.init("auto")`` at itself (Ray's address file) and its
  ``shutdown()`` deletes that file, whoever's cluster it names: both are undone, so parallel test
  workers and anything else on the machine keep finding their own cluster.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _restore(address_file: Path, previous: str | None) -> None:
    """Put back the file through which ``ray.init("auto")`` finds this machine's cluster."""
    if previous is not None:
        address_file.write_text(previous)
    else:
        address_file.unlink(missing_ok=True)


@contextlib.contextmanager
def ray_cluster(head_labels: dict[str, str] | None = None) -> Iterator[Any]:
    """A cluster with a one-CPU head (``head_labels`` on it; add worker nodes to the cluster yielded)."""
    import ray
    from ray._private.utils import get_ray_address_file
    from ray.cluster_utils import Cluster

    from rlsched import ray_connect

    ray_connect.disconnect()
    if ray.is_initialized():
        ray.shutdown()
    address_file = Path(get_ray_address_file(None))
    previous = address_file.read_text() if address_file.exists() else None
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "gcs_server_port": _free_port(), "include_dashboard": False,
        **({"labels": head_labels} if head_labels else {})})
    _restore(address_file, previous)
    try:
        yield cluster
    finally:
        ray_connect.disconnect()
        current = address_file.read_text() if address_file.exists() else None
        with contextlib.suppress(Exception):
            cluster.shutdown()
        _restore(address_file, current)
