"""The Scheduler protocol, the policy registry, and the shared heuristic skeleton.

Every scheduler - heuristic, learned or guarded - is ``decide(state) ->
Iterable[Decision]``. The caller (simulator engine or live runtime) applies each
decision as it is yielded, after the feasibility check, so a generator sees the
effect of its previous decision before making the next.

Heuristics share one skeleton (:class:`QueueHeuristic`): order the queue, place
each job with a placement rule, and (on clusters with elastic pools) ask an
autoscaler for capacity for what could not be placed. They differ in the order
(FIFO, SJF, weighted priority, LAS, fair share), the placement rule (first-fit,
best-fit, fragmentation-aware) and the scaling rule.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Protocol, runtime_checkable

from rlsched.cluster.decisions import Decision, Place
from rlsched.cluster.model import ClusterState, JobRun, Placement, PoolKind, Sharing
from rlsched.errors import ScenarioError
from rlsched.policies.autoscale import QueueAutoscaler
from rlsched.policies.placement import PlacementRule, first_fit


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


_REGISTRY: dict[str, tuple[Callable[..., Scheduler], str]] = {}


def register(name: str, summary: str) -> Callable[[Callable[..., Scheduler]], Callable[..., Scheduler]]:
    """Class decorator: make a scheduler selectable as ``--policy NAME``."""

    def deco(cls: Callable[..., Scheduler]) -> Callable[..., Scheduler]:
        _REGISTRY[name] = (cls, summary)
        return cls

    return deco


def available() -> dict[str, str]:
    """Registered policy names and their one-line summaries."""
    _load_builtin()
    return {k: v[1] for k, v in sorted(_REGISTRY.items())}


def make_policy(name: str, **params: Any) -> Scheduler:
    """Build a registered scheduler by name; unknown names get a did-you-mean error."""
    _load_builtin()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ScenarioError(f"unknown policy {name!r}{hint} (known: {', '.join(sorted(_REGISTRY))})")
    cls = _REGISTRY[name][0]
    try:
        return cls(**params)
    except TypeError as exc:
        raise ScenarioError(f"bad parameters for policy {name!r}: {exc}") from None


def _load_builtin() -> None:
    from rlsched.policies import heuristics  # noqa: F401  (registers the heuristics)


class QueueHeuristic:
    """Order the queue, place what fits, ask for capacity for the rest.

    Subclasses override :meth:`order` (and optionally :meth:`extra_decisions`).
    ``backfill=False`` stops at the first job that does not fit (strict order, as
    plain FIFO); with ``backfill=True`` later jobs that fit go ahead.

    Within one pass capacity only shrinks, so a request shape that failed once is
    not tried again in the same pass - this keeps a pass over a long queue cheap.
    """

    name: ClassVar[str] = "queue"
    backfill: bool = True

    def __init__(self, *, placement: PlacementRule = first_fit, autoscaler: QueueAutoscaler | None = None,
                 backfill: bool | None = None) -> None:
        self.placement = placement
        self.autoscaler = autoscaler or QueueAutoscaler()
        if backfill is not None:
            self.backfill = backfill
        self._elastic = False

    def reset(self, state: ClusterState) -> None:
        self._elastic = any(p.spec.kind.elastic for p in state.pools.values())
        self.autoscaler.reset(state)

    def order(self, state: ClusterState) -> Iterable[JobRun]:
        """Queued jobs in the order this policy serves them."""
        return sorted(state.queue.values(), key=lambda r: r.job.submit_time)

    def choose(self, state: ClusterState, run: JobRun) -> Placement | None:
        """Where ``run`` goes now, or None if it does not fit anywhere."""
        return self.placement(state, run)

    def extra_decisions(self, state: ClusterState, blocked: list[JobRun]) -> Iterator[Decision]:
        """Hook for preemption and the like, after the placement pass."""
        return iter(())

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        if not state.queue:
            return
        failed: set[tuple[Any, ...]] = set()
        blocked: list[JobRun] = []
        only_exclusive = all(p.spec.sharing is Sharing.EXCLUSIVE for p in state.pools.values())
        # Lazily: an order may be a generator that reads the state after each placement.
        for run in self.order(state):
            if run.job.job_id not in state.queue:
                continue
            if only_exclusive and not self._any_free(state):
                blocked.append(run)
                if not self.backfill:
                    break
                continue
            shape = run.job.shape + (run.job.preemptible,)
            if shape in failed:
                blocked.append(run)
                continue
            placement = self.choose(state, run)
            if placement is None:
                failed.add(shape)
                blocked.append(run)
                if not self.backfill:
                    break
                continue
            yield Place(run.job.job_id, placement)
        if blocked:
            yield from self.extra_decisions(state, blocked)
        if self._elastic and blocked:
            yield from self.autoscaler.decide(state, blocked)

    @staticmethod
    def _any_free(state: ClusterState) -> bool:
        for pool in state.pools.values():
            for node in pool.nodes.values():
                if node.free_whole > 0:
                    return True
        return False


def is_spot(state: ClusterState, placement: Placement) -> bool:
    return state.pools[placement.pool].spec.kind is PoolKind.SPOT
