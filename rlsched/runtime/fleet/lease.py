"""One scheduler service per Ray cluster: a lease the service takes before it drives any agent.

Two services placing jobs on the same GPUs would each believe its own allocations. The lease is a small
named, detached actor; a service takes it when it starts (:meth:`ServiceLease.acquire`) and renews it every
few seconds. A second service is refused with one line naming the holder, and the holder hears of the
attempt at its next renewal (the service writes it to its audit log).

The owner key is the service's machine and state directory, not its pid: a service restarted after a
``kill -9`` with the same state directory takes its lease back at once, while a different service waits
for the lease to expire (``ttl_s`` after the holder's last renewal).
"""

from __future__ import annotations

import time
from typing import Any

from rlsched.ray_connect import NAMESPACE
from rlsched.runtime.backend import BackendError

#: Seconds a lease lives after its holder's last renewal.
LEASE_TTL_S = 15.0
LEASE_NAME = "service-lease"


class LeaseHolder:
    """The lease actor's state (one per cluster; see the module doc)."""

    def __init__(self) -> None:
        self.owner = ""
        self.info: dict[str, Any] = {}
        self.renewed = 0.0
        self.ttl_s = LEASE_TTL_S
        self.contenders: list[dict[str, Any]] = []

    def acquire(self, owner: str, info: dict[str, Any], ttl_s: float) -> tuple[bool, dict[str, Any]]:
        """Take the lease if it is free, expired or already ``owner``'s; else record the attempt."""
        now = time.time()
        if not self.owner or self.owner == owner or now - self.renewed > self.ttl_s:
            self.owner, self.info, self.renewed, self.ttl_s = owner, dict(info), now, ttl_s
            return True, self.info
        self.contenders.append({**info, "time": now})
        return False, {**self.info, "renewed_s_ago": round(now - self.renewed, 1)}

    def renew(self, owner: str) -> tuple[bool, list[dict[str, Any]]]:
        """Extend ``owner``'s lease; also hands over (once) the attempts refused since the last renewal."""
        if self.owner != owner:
            return False, []
        self.renewed = time.time()
        refused, self.contenders = self.contenders, []
        return True, refused

    def release(self, owner: str) -> None:
        if self.owner == owner:
            self.owner, self.info = "", {}


class ServiceLease:
    """A service's hold on the cluster's lease (see the module doc)."""

    def __init__(self, owner: str, info: dict[str, Any], ttl_s: float = LEASE_TTL_S) -> None:
        self.owner = owner
        self.info = info
        self.ttl_s = ttl_s
        self._actor: Any = None

    def _holder(self) -> Any:
        if self._actor is None:
            import ray

            self._actor = ray.remote(LeaseHolder).options(name=LEASE_NAME, namespace=NAMESPACE, lifetime="detached",
                                                          get_if_exists=True, num_cpus=0).remote()
        return self._actor

    def acquire(self) -> None:
        """Take the lease.

        Raises:
            BackendError: another service holds it (the message names it).
        """
        import ray

        # generous: the first call also places the lease actor, which takes seconds on a loaded head
        ok, holder = ray.get(self._holder().acquire.remote(self.owner, self.info, self.ttl_s), timeout=120)
        if not ok:
            raise BackendError(
                f"another rlsched service drives this Ray cluster: {holder.get('service', '?')} (state dir "
                f"{holder.get('state_dir', '?')}, last renewed {holder.get('renewed_s_ago', '?')} s ago); stop it "
                f"first, or wait {self.ttl_s:g} s after it stopped")

    def renew(self) -> list[dict[str, Any]]:
        """Renew; the refused attempts since the last call. A lost lease actor is re-created and re-taken.

        Raises:
            BackendError: the lease was taken by another service meanwhile.
        """
        import ray
        from ray.exceptions import RayActorError

        try:
            ok, refused = ray.get(self._holder().renew.remote(self.owner), timeout=10)
        except RayActorError:  # the lease's node died: take a fresh one
            self._actor = None
            self.acquire()
            return []
        if not ok:
            self.acquire()
        return list(refused)

    def release(self) -> None:
        import contextlib

        import ray

        with contextlib.suppress(Exception):
            ray.get(self._holder().release.remote(self.owner), timeout=5)
