"""The Scheduler protocol: what the simulator, the environment and the live service drive.

Every scheduler - heuristic, learned or guarded - is ``decide(state) ->
Iterable[Decision]`` (the decisions of :mod:`rlsched.cluster.decisions`). The caller
(simulator engine or live runtime) applies each decision as it is yielded, after the
feasibility check, so a generator sees the effect of its previous decision before
making the next.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from rlsched.cluster.decisions import Decision
from rlsched.cluster.model import ClusterState


@runtime_checkable
class Scheduler(Protocol):
    """What the simulator and the runtime drive."""

    name: str

    def reset(self, state: ClusterState) -> None:
        """Forget per-run memory; called once before a run."""
        ...

    def decide(self, state: ClusterState) -> Iterable[Decision]:
        """Decisions for the current state, applied one by one as yielded."""
        ...
