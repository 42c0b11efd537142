"""Decision-loop detection: a scheduler that keeps deciding without making progress.

Time only moves when a scheduler's generator ends, so a scheduler that never stops
yielding - or yields hundreds of decisions that undo each other - stalls the
simulator and the live service alike: a model outside its training can alternate
``scale +1``, ``scale -1``, ``scale +1``... up to its per-decision-point cap while legal
placements are on offer (BENCHMARKS.md, "Models outside their training: masking and loop
hand-overs").

:class:`LoopDetector` watches the decisions of one decision point *before* each is
applied and names a loop when it sees one:

* **scale alternation**: a pool scaled in one direction, then the other, then back
  (``max_reversals`` direction changes on one pool) with nothing placed in between -
  capacity bought and cancelled without use;
* **no progress while jobs fit**: ``max_idle_decisions`` decisions in a row without a
  placement while some queued job could be placed right now (checked only when the
  count is reached, and again every ``max_idle_decisions`` decisions);
* **MIG re-split churn**, across decision points: a GPU re-split ``max_resplits`` times
  with nothing placed on it in between. A re-split keeps the GPU busy for a minute and
  its end is an event, so a policy that re-splits idle GPUs at every decision point
  never lets them serve and makes a decision point every minute for ever.

A placement resets the first two (and, on its GPU, the third). The simulator
(:meth:`rlsched.sim.engine.Engine.run`, through :class:`LoopBreaker`) and the live guard
(:class:`rlsched.runtime.fallback.FallbackScheduler`) use the same detector: the decision
that continues the loop is not applied, the scheduler's generator is closed and the
rest of the decision point goes to the fallback heuristic (weighted-priority); the
hand-over is counted (``loop_handovers`` in ``rlsched simulate``'s results;
``decision-loop`` fallbacks and audit records live). The heuristics are not watched
(``loop_exempt``: they are the baselines and the fallback, replayed as written, even
where their dynamic MIG re-splitting repeats itself, as FIFO's blocked head job makes it
do). A rule's preemptions come with the placements they make room for, so a model's
rules do not trip it either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from rlsched.cluster.decisions import Decision, Place, Reconfigure, Scale
from rlsched.cluster.feasibility import has_free_capacity, pool_candidates
from rlsched.cluster.model import ClusterState
from rlsched.cluster.scheduler import Scheduler

#: Builds the heuristic that finishes a looping decision point when :class:`LoopBreaker` is given none.
_default_fallback: Callable[[], Scheduler] | None = None


def set_default_fallback(factory: Callable[[], Scheduler]) -> None:
    """Make ``factory()`` the fallback of every :class:`LoopBreaker` built without one.

    The heuristics live above this layer, so they install their default here when
    :mod:`rlsched.policies.heuristics` is imported (weighted-priority).
    """
    global _default_fallback
    _default_fallback = factory


#: Queued jobs examined (one per request shape) when asking whether any job fits now.
_FIT_SCAN = 4096


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """Thresholds of :class:`LoopDetector`.

    Attributes:
        max_idle_decisions: decisions without a placement, at one decision point, after
            which a job that fits means the scheduler is looping.
        max_reversals: direction changes of one pool's scaling, at one decision point
            with nothing placed, that make a loop (2: up, down, up).
        max_resplits: re-splits of one MIG GPU with nothing placed on it in between that
            make a loop (3: dynamic MIG - a served model's complement, say - may re-split an
            idle GPU for a job that then starts elsewhere, and again for another; a third
            unused layout is churn).
    """

    max_idle_decisions: int = 64
    max_reversals: int = 2
    max_resplits: int = 3

    def __post_init__(self) -> None:
        if self.max_idle_decisions < 1 or self.max_reversals < 1 or self.max_resplits < 1:
            raise ValueError("max_idle_decisions, max_reversals and max_resplits must be >= 1")


def fitting_job(state: ClusterState) -> str | None:
    """The id of a queued job that some pool can take right now, or None."""
    if not state.queue or not has_free_capacity(state):
        return None
    now = state.time
    pools = list(state.pools.values())
    tried: set[tuple[object, ...]] = set()
    for n, run in enumerate(state.queue.values()):
        if n >= _FIT_SCAN:
            break
        if run.shape in tried:
            continue
        tried.add(run.shape)
        for pool in pools:
            if pool_candidates(pool, run.job, now, first=True):
                return run.job.job_id
    return None


class LoopDetector:
    """Names a decision loop: within a decision point, or MIG churn across them (see the module doc).

    Call :meth:`reset` before a run, :meth:`start` at each decision point, then
    :meth:`check` with each decision before applying it.
    """

    def __init__(self, config: LoopConfig | None = None) -> None:
        self.config = config or LoopConfig()
        self._idle = 0
        self._direction: dict[str, int] = {}
        self._reversals: dict[str, int] = {}
        #: (node, GPU) -> re-splits since something was last placed on it (kept across decision points)
        self._resplits: dict[tuple[str, int], int] = {}

    def reset(self) -> None:
        """A new run: forget everything, including the re-split counts."""
        self.start()
        self._resplits.clear()

    def start(self) -> None:
        """A new decision point: forget the previous one's decisions (not the re-split counts)."""
        self._idle = 0
        self._direction.clear()
        self._reversals.clear()

    def check(self, state: ClusterState, decision: Decision) -> str | None:
        """None if ``decision`` may be applied; else why it continues a loop (it should not be)."""
        if isinstance(decision, Place):
            self.start()
            if self._resplits:
                for gpu in decision.placement.gpus:
                    self._resplits.pop(gpu, None)
            return None
        if isinstance(decision, Reconfigure):
            key = (decision.node_id, decision.gpu_index)
            n = self._resplits.get(key, 0) + 1
            if n >= self.config.max_resplits:
                return (f"GPU {decision.gpu_index} of {decision.node_id} re-split {n} times with nothing "
                        f"placed on it")
            self._resplits[key] = n
        if isinstance(decision, Scale) and decision.delta != 0:
            sign = 1 if decision.delta > 0 else -1
            name = decision.pool
            last = self._direction.get(name)
            self._direction[name] = sign
            if last is not None and last != sign:
                n = self._reversals[name] = self._reversals.get(name, 0) + 1
                if n >= self.config.max_reversals:
                    return (f"pool {name} scaled up and down {n + 1} times at one decision point "
                            f"with nothing placed")
        self._idle += 1
        every = self.config.max_idle_decisions
        if self._idle % every == 0:
            fits = fitting_job(state)
            if fits is not None:
                return f"{self._idle} decisions without a placement while job {fits} fits"
        return None


class LoopBreaker:
    """Drives a scheduler through one decision point, handing a loop to the fallback heuristic.

    Args:
        fallback: the heuristic that finishes a looping decision point (default: the one
            :func:`set_default_fallback` installed, weighted-priority once :mod:`rlsched.policies`
            is imported). It is reset with the run (:meth:`reset`).
        config: the detector's thresholds.
    """

    def __init__(self, fallback: Scheduler | None = None, config: LoopConfig | None = None) -> None:
        if fallback is None:
            if _default_fallback is None:
                raise ValueError("LoopBreaker needs a fallback scheduler: pass one, or import rlsched.policies "
                                 "(it makes weighted-priority the default)")
            fallback = _default_fallback()
        self.fallback = fallback
        self.detector = LoopDetector(config)
        #: hand-overs per reason kind ("scale alternation", "MIG churn", "no progress")
        self.handovers: dict[str, int] = {}
        #: the last hand-over's full reason (for logs)
        self.last_reason = ""

    @property
    def total(self) -> int:
        """Decision points handed to the fallback."""
        return sum(self.handovers.values())

    def reset(self, state: ClusterState) -> None:
        self.fallback.reset(state)
        self.detector.reset()
        self.handovers.clear()
        self.last_reason = ""

    def drive(self, scheduler: Scheduler, state: ClusterState,
              apply: Callable[[Decision], object]) -> None:
        """Apply ``scheduler``'s decisions at this decision point; a loop goes to the fallback."""
        detector = self.detector
        detector.start()
        decisions: Iterable[Decision] = scheduler.decide(state)
        it: Iterator[Decision] = iter(decisions)
        why: str | None = None
        try:
            for d in it:
                why = detector.check(state, d)
                if why is not None:
                    break
                apply(d)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if why is None:
            return
        kind = loop_kind(why)
        self.handovers[kind] = self.handovers.get(kind, 0) + 1
        self.last_reason = why
        for d in self.fallback.decide(state):
            apply(d)


def loop_kind(reason: str) -> str:
    """The kind of a :meth:`LoopDetector.check` reason: ``scale alternation``, ``MIG churn``, ``no progress``."""
    if "scaled up and down" in reason:
        return "scale alternation"
    return "MIG churn" if "re-split" in reason else "no progress"
