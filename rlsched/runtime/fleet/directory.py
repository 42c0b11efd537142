"""Finding the node agents of a Ray cluster: one detached actor per live Ray node, pinned to it.

:class:`AgentDirectory` lists the live Ray nodes, creates the missing agents (or finds the ones a previous
service process created: they are named after their Ray node and detached, so they outlive a service
``kill -9``), asks each new one who it is, and maps every rlsched node name to the agent that manages it.

An agent is an actor with ``num_cpus=0, num_gpus=0``: it holds no Ray resources, so Ray's GPU accounting
never competes with rlsched's allocations, and it is placed with a hard ``NodeAffinitySchedulingStrategy``
(it runs on that node or not at all). Calls run concurrently in the actor (``max_concurrency``), so one
slow MIG change does not hold up every poll.

A Ray node labelled ``rlsched/agent=false`` (``ray start --labels=...``) gets no agent: a CPU-only head,
for instance. Every other node gets one; an agent that cannot start (rlsched not installed there) or
whose backend cannot open (no NVML) is reported in :attr:`AgentDirectory.problems`, one line per node.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rlsched.ray_connect import NAMESPACE, connect
from rlsched.runtime.backend import BackendError

LOG = logging.getLogger("rlsched.fleet")

#: Seconds one agent call may take before its node counts as not answering.
CALL_TIMEOUT_S = 5.0
#: Concurrent calls one agent serves.
AGENT_CONCURRENCY = 16
#: Label that keeps an agent off a Ray node.
NO_AGENT_LABEL = "rlsched/agent"


class AgentUnavailable(BackendError):
    """An agent did not answer (its node died, is partitioned, or the actor crashed)."""


class AnswerPending(AgentUnavailable):
    """A call's answer did not come within the wait, but the agent may still answer it: the call may yet run
    there (a launch sent to a busy agent starts when the agent gets to it)."""


@dataclass(frozen=True)
class SentCall:
    """A call on its way to an agent; :meth:`AgentDirectory.answer` waits for what it returns."""

    ref: AgentRef
    obj: Any


@dataclass
class AgentRef:
    """One agent: its Ray node, actor handle, and what it said about itself."""

    ray_node: str
    machine: str
    handle: Any
    hosts: list[str] = field(default_factory=list)
    error: str = ""
    pid: int = 0


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _cause(exc: BaseException) -> str:
    """One line for why an agent call failed (Ray wraps the remote exception's text in several lines)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BackendError):
        return str(cause)
    text = _ANSI.sub("", str(exc))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not set(ln.strip()) <= {"^"}]
    missing = next((ln for ln in lines if ln.startswith("ModuleNotFoundError:")), None)
    if missing is not None or "failed to import on the worker" in text:
        return (f"the agent cannot be imported there ({missing or 'import failed'}): install rlsched, the same "
                "version, on every Ray node")
    for ln in reversed(lines):  # the remote exception's own message is the last line of Ray's text
        if ":" in ln and not ln.startswith(("File ", "Traceback")):
            return ln
    return lines[-1] if lines else type(exc).__name__


class AgentDirectory:
    """The agents of the cluster at ``address`` (see the module doc); thread-safe.

    Raises:
        RayConnectError: the address is malformed or unreachable, or Ray is missing.
    """

    def __init__(self, address: str, *, call_timeout_s: float = CALL_TIMEOUT_S, agent_class: Any = None) -> None:
        self.address = address
        #: the class run as each node's agent (:class:`~rlsched.runtime.fleet.agent.NodeAgent`)
        self.agent_class = agent_class
        self.gcs = connect(address, what="--backend ray:")
        self.call_timeout_s = call_timeout_s
        self._lock = threading.RLock()
        self._agents: dict[str, AgentRef] = {}
        #: ray node id (or machine) -> why its agent is missing or its backend failed; one line each
        self.problems: dict[str, str] = {}

    # ------------------------------------------------------------------ discovery
    def refresh(self) -> list[AgentRef]:
        """Agents of the live Ray nodes now (creating missing ones; dropping those of dead nodes)."""
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        with self._lock:
            live = {n["NodeID"] for n in nodes}
            for gone in set(self._agents) - live:
                ref = self._agents.pop(gone)
                LOG.warning("Ray node %s (%s) left the cluster: nodes %s unknown", gone[:8], ref.machine,
                            ", ".join(ref.hosts) or "-")
            fresh = []
            for n in nodes:
                nid = n["NodeID"]
                if nid in self._agents or str((n.get("Labels") or {}).get(NO_AGENT_LABEL, "")).lower() == "false":
                    continue
                fresh.append((nid, str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or nid[:8]),
                              self._create(nid)))
            if fresh:
                self._greet(fresh)
            return list(self._agents.values())

    def _create(self, ray_node: str) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from rlsched.runtime.fleet.agent import NodeAgent

        actor = ray.remote(self.agent_class or NodeAgent)
        return actor.options(name=f"agent-{ray_node}", namespace=NAMESPACE, lifetime="detached",
                             get_if_exists=True, num_cpus=0, num_gpus=0, max_concurrency=AGENT_CONCURRENCY,
                             max_restarts=0,
                             scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node, soft=False)).remote()

    def _greet(self, fresh: list[tuple[str, str, Any]]) -> None:
        """Ask new agents who they are (in parallel); an agent that does not answer is retried next time."""
        import ray

        pending = {h.hello.remote(): (nid, machine, h) for nid, machine, h in fresh}
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=max(self.call_timeout_s, 20.0))
        for ref in ready:
            nid, machine, handle = pending[ref]
            try:
                hello = ray.get(ref)
            except Exception as exc:
                why = _cause(exc)
                if self.problems.get(nid) != f"Ray node {machine} ({nid[:8]}): no agent: {why}":
                    LOG.error("Ray node %s (%s): no agent: %s", machine, nid[:8], why)
                self.problems[nid] = f"Ray node {machine} ({nid[:8]}): no agent: {why}"
                import contextlib

                with contextlib.suppress(Exception):
                    ray.kill(handle)
                continue
            ref_ = AgentRef(nid, str(hello.get("machine") or machine), handle, list(hello.get("hosts") or []),
                            str(hello.get("error") or ""), int(hello.get("pid") or 0))
            self._agents[nid] = ref_
            if ref_.error:
                self.problems[nid] = f"Ray node {machine} ({nid[:8]}): {ref_.error}"
                LOG.error("Ray node %s (%s): %s", machine, nid[:8], ref_.error)
            else:
                self.problems.pop(nid, None)
                LOG.info("agent on Ray node %s (%s): nodes %s", machine, nid[:8], ", ".join(ref_.hosts) or "-")

    # ------------------------------------------------------------------ lookups
    def agents(self) -> list[AgentRef]:
        """The agents known now (no refresh)."""
        with self._lock:
            return list(self._agents.values())

    def agent_for(self, host: str) -> AgentRef | None:
        """The agent managing rlsched node ``host``, if a live one does."""
        with self._lock:
            for ref in self._agents.values():
                if host in ref.hosts:
                    return ref
        return None

    def note_hosts(self, ray_node: str, hosts: list[str]) -> None:
        """Record the nodes an agent reported in its latest inventory."""
        with self._lock:
            ref = self._agents.get(ray_node)
            if ref is not None:
                ref.hosts = hosts

    def forget(self, ray_node: str) -> None:
        """Drop an agent that failed (its actor died): the next refresh creates a new one if the node lives."""
        with self._lock:
            self._agents.pop(ray_node, None)

    def call(self, ref: AgentRef, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """``ref.handle.method(*args)`` and its result within the call timeout.

        Raises:
            AgentUnavailable: the agent did not answer in time or died (its node is gone or partitioned).
            Exception: what the agent's method raised (a BackendError, an ExecutorError), as itself.
        """
        return self.answer(self.send(ref, method, *args), self.call_timeout_s if timeout_s is None else timeout_s)

    def send(self, ref: AgentRef, method: str, *args: Any) -> SentCall:
        """Send ``ref.handle.method(*args)`` without waiting (see :meth:`answer`).

        Raises:
            AgentUnavailable: the call could not be sent (the actor is known to be dead).
        """
        try:
            return SentCall(ref, getattr(ref.handle, method).remote(*args))
        except Exception as exc:
            raise self._failure(ref, exc) from None

    def answer(self, sent: SentCall, timeout_s: float) -> Any:
        """What ``sent`` returned, waiting up to ``timeout_s`` (0: only look).

        Raises:
            AnswerPending: no answer yet; the agent may still run the call (ask again later).
            AgentUnavailable: the agent died or its node left, so no answer will come.
            Exception: what the agent's method raised (a BackendError, an ExecutorError), as itself.
        """
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            return ray.get(sent.obj, timeout=timeout_s)
        except GetTimeoutError:
            raise AnswerPending(f"agent on {sent.ref.machine} did not answer within {timeout_s:g} s") from None
        except Exception as exc:
            raise self._failure(sent.ref, exc) from None

    def _failure(self, ref: AgentRef, exc: Exception) -> Exception:
        """What a failed agent call means: the agent's own exception (a BackendError, an ExecutorError) when
        its method raised one, else :class:`AgentUnavailable` (timed out, or the actor died: forgotten, so
        the next refresh makes a new one if its node lives)."""
        from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

        cause = getattr(exc, "cause", None)
        if isinstance(exc, RayTaskError) and isinstance(cause, Exception):
            return cause
        if isinstance(exc, RayActorError):
            self.forget(ref.ray_node)
        if isinstance(exc, (GetTimeoutError, RayActorError)):
            return AgentUnavailable(f"agent on {ref.machine} did not answer: {_cause(exc)}")
        if isinstance(exc, RayError):
            return AgentUnavailable(f"agent on {ref.machine}: {_cause(exc)}")
        return exc

    def require(self, host: str) -> AgentRef:
        """The agent managing ``host``, refreshing the directory once if none is known.

        Raises:
            AgentUnavailable: no live agent manages it.
        """
        ref = self.agent_for(host)
        if ref is None:
            self.refresh()
            ref = self.agent_for(host)
        if ref is None:
            raise AgentUnavailable(f"node {host} has no live agent")
        return ref

    def fan_out(self, refs: list[AgentRef], method: str, *args: Any) -> dict[str, Any]:
        """Call ``method`` on every agent at once; ray node id -> result, or the exception it raised."""
        return self.fan_out_each(refs, method, {r.ray_node: args for r in refs})

    def fan_out_each(self, refs: list[AgentRef], method: str, args: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
        """:meth:`fan_out` with each agent's own arguments (``args`` by ray node id)."""
        import ray

        pending = {getattr(r.handle, method).remote(*args[r.ray_node]): r for r in refs}
        out: dict[str, Any] = {}
        deadline = time.monotonic() + self.call_timeout_s
        remaining = list(pending)
        while remaining and time.monotonic() < deadline:
            ready, remaining = ray.wait(remaining, num_returns=len(remaining),
                                        timeout=max(0.0, deadline - time.monotonic()))
            for obj in ready:
                r = pending[obj]
                try:
                    out[r.ray_node] = ray.get(obj)
                except Exception as exc:
                    out[r.ray_node] = self._failure(r, exc)
        for obj in remaining:
            out[pending[obj].ray_node] = AgentUnavailable(f"agent on {pending[obj].machine} did not answer "
                                                          f"within {self.call_timeout_s:g} s")
        return out
