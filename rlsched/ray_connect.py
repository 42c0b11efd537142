"""Connecting to a Ray cluster from an address the user typed: ``auto`` or ``HOST:PORT``.

rlsched runs its fleet runtime and its distributed training on Ray rather than a protocol of its own;
this module is the one place that turns a ``--backend ray:...`` / ``--ray ...`` value into a connected
driver, so every command reports a bad or unreachable address with the same one line.

* ``auto``: the Ray cluster already running on this machine (``ray start --head``) if there is one,
  else a local head started for this process (one machine, no set-up; it stops with the process).
* ``HOST:PORT``: the head's GCS address of an existing cluster (``ray start --head --port PORT``
  prints it). A TCP probe runs first: ``ray.init`` on an address nobody listens on retries for minutes
  before failing, and a user should see "cannot reach" in seconds.

``ray`` is imported only inside :func:`connect`: commands that never touch Ray stay fast and work on
machines without it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass

from rlsched.errors import RlschedError

#: Ray namespace of everything rlsched creates on a cluster (agents, the service lease): named actors
#: of other applications never collide with rlsched's, and two rlsched services find each other's.
NAMESPACE = "rlsched"
#: Seconds the TCP probe of ``HOST:PORT`` waits.
PROBE_TIMEOUT_S = 5.0

_lock = threading.Lock()
_connected: str | None = None


class RayConnectError(RlschedError):
    """The Ray address is malformed, unreachable, or Ray is not installed (one line, says which)."""


@dataclass(frozen=True, slots=True)
class RayAddress:
    """A parsed address: ``auto`` (host/port empty) or a cluster's ``host:port``."""

    host: str = ""
    port: int = 0

    @property
    def auto(self) -> bool:
        return not self.host

    def __str__(self) -> str:
        return "auto" if self.auto else f"{self.host}:{self.port}"


def parse_address(text: str, what: str = "--ray") -> RayAddress:
    """Parse ``auto`` or ``HOST:PORT`` (``what`` names the option in the error).

    Raises:
        RayConnectError: anything else, with the accepted forms.
    """
    text = text.strip()
    if text == "auto":
        return RayAddress()
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit() and 0 < int(port) < 65536:
        return RayAddress(host.strip("[]"), int(port))
    raise RayConnectError(f"{what} {text!r}: expected 'auto' (this machine) or HOST:PORT of a Ray head's GCS, "
                          "e.g. 10.0.0.5:6379")


def probe(addr: RayAddress, what: str = "--ray") -> None:
    """Fail fast (one line) when nothing listens at ``addr`` (no-op for ``auto``)."""
    if addr.auto:
        return
    try:
        with socket.create_connection((addr.host, addr.port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayConnectError(f"{what} {addr}: cannot reach a Ray head there ({reason.lower()}); "
                              "is 'ray start --head' running there and the port open?") from None


def connect(addr: RayAddress | str, what: str = "--ray") -> str:
    """Connect this process to the cluster at ``addr`` once (later calls reuse it); returns its GCS address.

    Raises:
        RayConnectError: Ray not installed, the address unreachable, or this process already connected
            to a different cluster.
    """
    global _connected
    if isinstance(addr, str):
        addr = parse_address(addr, what)
    try:
        import ray
    except ImportError:
        raise RayConnectError(f"{what} {addr}: Ray is not installed; pip install 'rlsched[fleet]'") from None
    with _lock:
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if addr.auto or current.endswith(f":{addr.port}"):
                return str(current)
            raise RayConnectError(f"{what} {addr}: this process is already connected to the Ray "
                                  f"cluster at {current}")
        probe(addr, what)
        try:
            if addr.auto:
                try:
                    ray.init(address="auto", namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError):
                    # no cluster on this machine: a head of our own, CPU-only accounting
                    # (rlsched's allocations are the GPU truth, never Ray's)
                    ray.init(namespace=NAMESPACE, num_gpus=0, include_dashboard=False, logging_level=logging.ERROR,
                             log_to_driver=False)
            else:
                ray.init(address=f"{addr.host}:{addr.port}", namespace=NAMESPACE, logging_level=logging.ERROR,
                         log_to_driver=False)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RayConnectError(f"{what} {addr}: could not join the Ray cluster: {first}") from None
        _connected = str(ray.get_runtime_context().gcs_address)
        os.environ.setdefault("RAY_ADDRESS", _connected)  # subprocesses (e.g. SubprocVecEnv workers) join it too
        return _connected


def disconnect() -> None:
    """Leave the cluster (stops a head this process started); a no-op when not connected."""
    global _connected
    with _lock:
        if _connected is None:
            return
        import ray

        ray.shutdown()
        if os.environ.get("RAY_ADDRESS") == _connected:
            del os.environ["RAY_ADDRESS"]
        _connected = None
