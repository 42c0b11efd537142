"""Job slots filled by nomination: what each heuristic would run next.

A learned policy that must never lose to the best heuristic needs that heuristic's
choice among its options at every decision point, wherever the choice lies in a
queue of thousands. A :class:`Nomination` fills the codec's job slots from the
queue orders of several heuristics (``fifo``, ``weighted-priority``, ``sjf``,
``fair-share``): each nominates its first jobs *that fit now* (the job it would
place next with backfilling, and the ones after it), and the union, in nominator
order, is the window. Every heuristic's next placement is therefore one action
away, and the policy learns where to depart from it.

Each slot also says who nominated it and at which rank (``nominated_<name>`` =
``1 / (1 + rank)``, 0 when not nominated), so "do what SJF would do" is a pattern
the shared per-slot scorer can express exactly, whatever the queue's depth, plus
the job's user's share of the GPUs in use (the signal fair-share orders by). Every
added feature is a rank or a fraction, so it keeps its range when the fleet or the
queue grows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from rlsched.cluster.model import ClusterState, JobRun

#: The heuristics whose queue orders may nominate slots, by ``--policy`` name.
NOMINATORS: tuple[str, ...] = ("fifo", "weighted-priority", "sjf", "fair-share")


class NominationError(ValueError):
    """A nominator list naming an unknown heuristic, a duplicate, or more nominators than slots."""


class Nomination:
    """Selects the window from several heuristics' queue orders and describes each slot.

    Args:
        names: nominators, each one of :data:`NOMINATORS`, in slot order.
        window: the codec's job slots K; each nominator gets ``K // len(names)`` slots
            (the remainder goes to the first ones).
    """

    def __init__(self, names: Sequence[str], window: int) -> None:
        names = tuple(names)
        if not names:
            raise NominationError("nominators: name at least one heuristic")
        unknown = [n for n in names if n not in NOMINATORS]
        if unknown:
            raise NominationError(f"nominators: unknown heuristic {unknown[0]!r} (one of {', '.join(NOMINATORS)})")
        if len(set(names)) != len(names):
            raise NominationError("nominators: each heuristic at most once")
        if len(names) > window:
            raise NominationError(f"nominators: {len(names)} nominators need at least as many job slots, got {window}")
        from rlsched.policies.registry import make_policy

        self.names = names
        self.window = window
        base, extra = divmod(window, len(names))
        #: slots per nominator
        self.quota = [base + (1 if i < extra else 0) for i in range(len(names))]
        self._orders: list[Callable[[ClusterState], Iterable[JobRun]]] = [
            make_policy(n).order for n in names  # type: ignore[attr-defined]
        ]
        #: feature columns appended to every job slot
        self.features: tuple[str, ...] = (*(f"nominated_{n}" for n in names), "user_gpu_share")

    def select(self, state: ClusterState, fits: Callable[[JobRun], bool]) -> tuple[list[JobRun], np.ndarray]:
        """The window's jobs (each nominator's first jobs that fit, deduplicated) and their extra features.

        A nominator whose order has fewer fitting jobs than its quota fills the rest
        with its first jobs that do not fit (the ones a reservation or a purchase is
        for). Columns: :attr:`features`, one row per slot (zero rows pad a short window).
        """
        k = self.window
        n_nom = len(self.names)
        taken: dict[str, int] = {}  # job id -> slot
        runs: list[JobRun] = []
        ranks: list[dict[str, int]] = []  # per nominator: job id -> rank among the jobs it nominates
        memo: dict[object, bool] = {}

        def fits_now(run: JobRun) -> bool:
            key = (run.shape, run.job.cpus, run.job.mem_mib)
            ok = memo.get(key)
            if ok is None:
                ok = memo[key] = fits(run)
            return ok

        for order, quota in zip(self._orders, self.quota, strict=True):
            mine: dict[str, int] = {}
            blocked: list[JobRun] = []
            for run in order(state):
                if len(mine) >= quota:
                    break
                if fits_now(run):
                    mine[run.job.job_id] = len(mine)
                    if run.job.job_id not in taken:
                        taken[run.job.job_id] = len(runs)
                        runs.append(run)
                elif len(blocked) < quota:
                    blocked.append(run)
            # Fewer fitting jobs than slots: the first blocked ones (what capacity would be for).
            for run in blocked:
                if len(mine) >= quota:
                    break
                mine[run.job.job_id] = len(mine)
                if run.job.job_id not in taken:
                    taken[run.job.job_id] = len(runs)
                    runs.append(run)
            ranks.append(mine)
        # Slots a duplicate left free go to the next jobs of the queue's own order.
        if len(runs) < k:
            for run in state.queue.values():
                if len(runs) >= k:
                    break
                if run.job.job_id not in taken:
                    taken[run.job.job_id] = len(runs)
                    runs.append(run)
        cols = np.zeros((k, n_nom + 1), dtype=np.float32)
        for j, mine in enumerate(ranks):
            for jid, rank in mine.items():
                slot = taken.get(jid)
                if slot is not None and slot < k:
                    cols[slot, j] = 1.0 / (1.0 + rank)
        if runs:
            usage: dict[str, float] = {}
            total = 0.0
            for r in state.running.values():
                usage[r.job.user] = usage.get(r.job.user, 0.0) + r.job.gpu_demand
                total += r.job.gpu_demand
            if total > 0:
                for i, run in enumerate(runs[:k]):
                    cols[i, n_nom] = usage.get(run.job.user, 0.0) / total
        return runs[:k], cols
