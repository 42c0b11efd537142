"""The service's in-memory mirror of every unfinished job, and the live view kept in step with it.

The mirror (queued jobs in submission order, jobs holding GPUs, counts of finished jobs) is loaded from
the store at start, by recovery and after a failed transaction, and updated by every transition the
service makes *after* the store committed it, so a scheduling pass neither re-reads nor re-decodes the
queue. The live view (:mod:`rlsched.service.view`), once built from the mirror, is updated by the same
transitions; it is dropped (None) whenever it must be rebuilt. Every change happens under the service's
scheduling lock.
"""

from __future__ import annotations

from rlsched.cluster.job import Job
from rlsched.runtime.store import JobRecord, JobState, Store
from rlsched.service.view import LiveView, drop_queued, enqueue_record, release_job


class JobMirror:
    """The unfinished jobs as the store last committed them (see the module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: queued jobs, in ``seq`` order when :attr:`_queued_in_order`
        self.queued: dict[str, JobRecord] = {}
        #: running and preempted jobs (those holding GPUs)
        self.holding: dict[str, JobRecord] = {}
        self._queued_in_order = True
        #: finished jobs per terminal state
        self.finished: dict[str, int] = {}
        #: a reload failed: the next loop iteration tries again
        self.stale = False
        #: job id -> the Job policies see (a request never changes; cleared when the spec does).
        self.job_cache: dict[str, Job] = {}
        #: bumped by every transition folded into the mirror; a pass runs only when it moved.
        self.gen = 0
        #: the live view built from the mirror (None: to be rebuilt)
        self.view: LiveView | None = None

    def load(self) -> None:
        """(Re)load the unfinished jobs from the store (start, recover, after a failed transaction)."""
        self.view = None
        recs = self.store.jobs([JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED])
        counts = self.store.counts()
        self.queued = {r.id: r for r in recs if r.state is JobState.QUEUED}
        self.holding = {r.id: r for r in recs if r.state.holds_gpus}
        self._queued_in_order = True
        self.finished = {st.value: counts.get(st.value, 0) for st in JobState if st.terminal}
        self.job_cache = {}
        self.gen += 1
        self.stale = False

    def queued_records(self) -> list[JobRecord]:
        """The queued jobs in submission (``seq``) order."""
        if not self._queued_in_order:
            self.queued = dict(sorted(self.queued.items(), key=lambda kv: kv[1].seq))
            self._queued_in_order = True
        return list(self.queued.values())

    def get(self, job_id: str) -> JobRecord | None:
        """An unfinished job's record (None: finished or unknown)."""
        return self.queued.get(job_id) or self.holding.get(job_id)

    def counts(self) -> dict[str, int]:
        """Jobs per state, from the mirror (what ``Store.counts`` would say, without a table scan)."""
        out = {st.value: 0 for st in JobState}
        out.update(self.finished)
        out[JobState.QUEUED.value] = len(self.queued)
        for r in self.holding.values():
            out[r.state.value] += 1
        return out

    def count_finished(self, state: JobState) -> None:
        """One more finished job in ``state`` that never entered the mirror (cancelled before it folded in)."""
        self.finished[state.value] = self.finished.get(state.value, 0) + 1

    def forget_finished(self, state: JobState) -> None:
        """One finished job in ``state`` fewer (history retention removed it)."""
        self.finished[state.value] = max(0, self.finished.get(state.value, 0) - 1)

    def track(self, rec: JobRecord) -> None:
        """Fold a job's COMMITTED record into the mirror and the live view."""
        jid = rec.id
        old = self.queued.pop(jid, None)
        if old is None:
            old = self.holding.pop(jid, None)
        was = old.state if old is not None else None
        state = rec.state
        if state is JobState.QUEUED:
            if self._queued_in_order and self.queued and next(reversed(self.queued.values())).seq > rec.seq:
                self._queued_in_order = False  # a requeued job goes back to its submission place
            self.queued[jid] = rec
        elif state.holds_gpus:
            self.holding[jid] = rec
        else:
            self.finished[state.value] = self.finished.get(state.value, 0) + 1
            self.job_cache.pop(jid, None)
        if was is state:
            return  # a pid recorded, a cancel requested: nothing a policy sees
        self.gen += 1
        view = self.view
        if view is None:
            return
        if was is JobState.QUEUED:
            drop_queued(view, jid)  # (a placement of this pass already took it out of the queue)
        elif was is not None and was.holds_gpus and not state.holds_gpus:
            release_job(view, jid)
        elif was is None and state.holds_gpus:
            self.view = None  # not a transition this service makes: rebuild
            return
        if state is JobState.PREEMPTED:
            view.state.running.pop(jid, None)
        elif state is JobState.QUEUED:
            enqueue_record(view, rec, self.job_cache)
