"""Refresh: read the live inventory a plan is computed against.

Kept apart from :mod:`rlsched.plan.diff` so that the diff stays a pure function of
(spec, inventory, state) and can be tested without any backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsched.runtime.backend import BackendError, GpuBackend, NodeInfo


@dataclass(frozen=True, slots=True)
class Refreshed:
    """Inventory at refresh time plus running jobs per node (drain estimates only, never diffed)."""

    nodes: dict[str, NodeInfo]
    running_jobs: dict[str, int] = field(default_factory=dict)


def refresh(backend: GpuBackend) -> Refreshed:
    """Read every node the backend knows (a spec node it does not report is planned as unknown, ``?``).

    A node whose job count cannot be read keeps an estimate of 0: the count is only
    shown in the plan and never decides whether a change is planned.
    """
    nodes = {n.hostname: n for n in backend.inventory()}
    jobs: dict[str, int] = {}
    for host, n in nodes.items():
        if not n.reachable:
            continue
        try:
            jobs[host] = int(backend.running_jobs(host))
        except BackendError:
            jobs[host] = sum(g.processes for g in n.gpus)
    return Refreshed(nodes=nodes, running_jobs=jobs)
