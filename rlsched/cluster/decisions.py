"""Decisions a scheduler can make; data only, checked by feasibility before use.

Every scheduler (heuristics, the PPO policy, the fallback guard) returns a list
of these from ``decide(state)``. The simulator engine and the runtime apply them
one by one after :mod:`rlsched.cluster.feasibility` accepts each; a refused decision
is counted and never applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsched.cluster.model import Placement


@dataclass(frozen=True, slots=True)
class Place:
    """Start queued job ``job_id`` on ``placement``."""

    job_id: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop running job ``job_id`` and requeue it.

    ``checkpoint=True`` is a graceful suspend (the job checkpoints first and loses
    no work, paying the restart overhead); False is an abrupt kill that loses the
    work since its last periodic checkpoint.
    """

    job_id: str
    reason: str = "priority"
    checkpoint: bool = True


@dataclass(frozen=True, slots=True)
class Scale:
    """Grow (``delta > 0``) or shrink (``delta < 0``) an elastic pool by whole nodes.

    Shrinking stops provisioning nodes first, then idle ready nodes; busy nodes
    are never stopped by a scale-down.
    """

    pool: str
    delta: int


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Change the MIG layout of one idle GPU (destroys and recreates its instances)."""

    node_id: str
    gpu_index: int
    layout: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Ask to be consulted again at ``time`` even if nothing else happens."""

    time: float


Decision = Place | Preempt | Scale | Reconfigure | WakeAt
