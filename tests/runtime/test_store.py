"""The SQLite job store: lifecycle, audit, idempotency, schema, concurrency and kill -9 safety."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.feasibility import profile_for
from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.store import (
    SCHEMA_VERSION,
    Allocation,
    IdempotencyConflictError,
    InvalidTransitionError,
    JobState,
    Store,
    StoreError,
    UnknownJobError,
)

ALLOC = Allocation("node-1", ("GPU-aaaa", "GPU-bbbb"), pool="onprem", gpu_indices=(0, 1))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "rlsched.db") as s:
        yield s


def test_wal_mode_schema_version_and_pragmas(store: Store) -> None:
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.schema_version == SCHEMA_VERSION
    assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    conn.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    Store(tmp_path / "db").close()
    conn = sqlite3.connect(tmp_path / "db")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(tmp_path / "db")


def test_older_schema_migrates_and_audit_by_event_uses_its_index(tmp_path: Path) -> None:
    # a version-2 database (before the audit event index) written with a record of each kind
    with Store(tmp_path / "db") as s:
        jid = s.submit(["a"], user="u1")
        s.append_audit(AuditEvent.MIG_RECONFIGURATION, gpus=("GPU-a",), reason="re-split")
    conn = sqlite3.connect(tmp_path / "db")
    conn.execute("DROP INDEX audit_by_event")
    conn.execute("DROP INDEX jobs_by_finish")
    conn.execute("PRAGMA user_version=2")
    conn.commit()
    conn.close()
    with Store(tmp_path / "db") as s:
        assert s.schema_version == SCHEMA_VERSION == 4
        assert s.get(jid) is not None
        assert [r.reason for r in s.audit(event=AuditEvent.MIG_RECONFIGURATION)] == ["re-split"]
        plan = s._conn().execute("EXPLAIN QUERY PLAN SELECT * FROM audit WHERE id > 0 AND event = ? ORDER BY id",
                                 (AuditEvent.MIG_RECONFIGURATION.value,)).fetchall()
        assert any("audit_by_event" in str(tuple(row)) for row in plan), [tuple(r) for r in plan]
        plan = s._conn().execute("EXPLAIN QUERY PLAN SELECT * FROM jobs WHERE state IN (?, ?) AND finished_at >= ? "
                                 "ORDER BY seq", ("done", "failed", 0.0)).fetchall()
        assert any("jobs_by_finish" in str(tuple(row)) for row in plan), [tuple(r) for r in plan]


def test_jobs_finished_since(store: Store) -> None:
    a, b, c = store.submit(["a"]), store.submit(["b"]), store.submit(["c"])
    store.cancel(a)
    store.cancel(b)
    finished = {r.id: r.finished_at for r in store.jobs(finished_since=0.0)}
    assert set(finished) == {a, b}  # c never finished
    latest = max(t for t in finished.values() if t is not None)
    assert {r.id for r in store.jobs([JobState.CANCELLED], finished_since=latest)} == {
        k for k, t in finished.items() if t is not None and t >= latest}
    assert store.jobs(finished_since=latest + 1.0) == []
    assert store.jobs([JobState.DONE], finished_since=0.0) == []
    assert [r.id for r in store.jobs()] == [a, b, c]  # no filter: everything, in submission order


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    with Store(tmp_path / "db") as s:
        jid = s.submit(["train.py", "--lr", "0.1"], gpus=2, priority=5, user="ana", preemptible=True, deadline=99.0)
    with Store(tmp_path / "db") as s:
        rec = s.get(jid)
        assert rec is not None
        assert rec.argv == ("train.py", "--lr", "0.1") and rec.num_gpus == 2 and rec.priority == 5
        assert rec.user == "ana" and rec.preemptible and rec.deadline == 99.0 and rec.state is JobState.QUEUED


def test_lifecycle_and_audit_trail(store: Store) -> None:
    a = store.submit(["a"], user="u1")
    b = store.submit(["b"], user="u2", priority=3)
    assert [r.id for r in store.queued()] == [a, b]
    rec = store.mark_running(a, ALLOC, pid=1234, pid_start=999, log_path="/logs/a.log", policy="ppo:v1",
                             model_version="v1@abc")
    assert rec.state is JobState.RUNNING and rec.attempts == 1 and rec.allocation == ALLOC
    assert rec.pid == 1234 and rec.pid_start == 999 and rec.started_at is not None
    assert [r.id for r in store.running()] == [a] and [r.id for r in store.queued()] == [b]
    done = store.mark_finished(a, 0)
    assert done.state is JobState.DONE and done.exit_code == 0 and done.finished_at is not None
    store.mark_running(b, ALLOC, 5, 6)
    assert store.mark_finished(b, 3).state is JobState.FAILED
    events = [(r.event, r.job) for r in store.audit()]
    assert events == [(AuditEvent.SUBMISSION, a), (AuditEvent.SUBMISSION, b), (AuditEvent.ALLOCATION, a),
                      (AuditEvent.COMPLETION, a), (AuditEvent.ALLOCATION, b), (AuditEvent.COMPLETION, b)]
    alloc = store.audit(job=a)[1]
    assert alloc.gpus == ALLOC.devices and alloc.policy == "ppo:v1" and alloc.model_version == "v1@abc"
    # the id cursor returns each record once
    first = store.audit(limit=2)
    assert [r.id for r in store.audit(since=first[-1].id)] == [r.id for r in store.audit()[2:]]
    assert store.check_invariants() == []


def test_preempt_then_requeue_clears_allocation_and_counts_attempts(store: Store) -> None:
    j = store.submit(["x"], preemptible=True)
    store.mark_running(j, ALLOC, 1, 2)
    pre = store.preempt(j, "priority")
    assert pre.state is JobState.PREEMPTED and pre.allocation == ALLOC  # GPUs held until the process exits
    back = store.requeue(j, "preempted for j-high")
    assert back.state is JobState.QUEUED and back.allocation is None and back.pid is None
    assert back.reason == "preempted for j-high"
    again = store.mark_running(j, ALLOC, 3, 4)
    assert again.attempts == 2
    stages = [r.extra.get("stage") for r in store.audit(job=j) if r.event is AuditEvent.PREEMPTION]
    assert stages == ["stopping", "requeued"]


def test_invalid_transitions_are_refused(store: Store) -> None:
    j = store.submit(["x"])
    with pytest.raises(InvalidTransitionError):
        store.mark_finished(j, 0)
    with pytest.raises(InvalidTransitionError):
        store.requeue(j, "why")
    store.mark_running(j, ALLOC, 1, 2)
    with pytest.raises(InvalidTransitionError):  # compare-and-set: a job starts once
        store.mark_running(j, ALLOC, 1, 2)
    with pytest.raises(UnknownJobError):
        store.mark_running("j-nope", ALLOC, 1, 2)
    with pytest.raises(StoreError):
        store.submit("echo hi")  # a shell string is not an argv
    with pytest.raises(StoreError):
        store.submit(["x"], gpus=2, gpu_milli=500)
    assert store.get("j-nope") is None


def test_cancel_queued_and_running(store: Store) -> None:
    q = store.submit(["q"])
    assert store.cancel(q) is JobState.CANCELLED
    assert store.cancel(q) is JobState.CANCELLED  # idempotent
    r = store.submit(["r"])
    store.mark_running(r, ALLOC, 1, 2)
    assert store.cancel(r) is JobState.RUNNING  # requested: the process must stop first
    rec = store.get(r)
    assert rec is not None and rec.cancel_requested and rec.allocation == ALLOC
    assert store.mark_finished(r, -15).state is JobState.CANCELLED
    p = store.submit(["p"])
    store.mark_running(p, ALLOC, 1, 2)
    store.cancel(p)
    assert store.requeue(p, "stopped").state is JobState.CANCELLED  # a cancelled job is not requeued
    assert [r.event for r in store.audit(job=q)] == [AuditEvent.SUBMISSION, AuditEvent.CANCEL]


def test_idempotency_key(store: Store) -> None:
    a = store.submit(["train", "x"], gpus=1, idempotency_key="req-1")
    assert store.submit(["train", "x"], gpus=1, idempotency_key="req-1") == a
    with pytest.raises(IdempotencyConflictError):
        store.submit(["train", "y"], gpus=1, idempotency_key="req-1")
    assert len(store.jobs()) == 1
    assert len([r for r in store.audit() if r.event is AuditEvent.SUBMISSION]) == 1


def test_mig_profile_request_maps_to_that_profile(store: Store) -> None:
    j = store.submit(["infer"], mig_profile="3g.40gb")
    rec = store.get(j)
    assert rec is not None and rec.mig_profile == "3g.40gb" and rec.num_gpus == 1
    job = rec.to_job()
    prof = profile_for(gpu_model("H100-80GB"), job.num_gpus, job.gpu_milli)
    assert prof is not None and prof.name == "3g.40gb"
    with pytest.raises(StoreError):
        store.submit(["x"], mig_profile="big")


def test_audit_is_append_only(store: Store) -> None:
    rid = store.append_audit(AuditEvent.POLICY_SWITCH, policy="weighted-priority", reason="circuit-open",
                             extra={"failures": 3})
    conn = sqlite3.connect(store.path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE audit SET reason = 'x' WHERE id = ?", (rid,))
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM audit")
    conn.close()
    rec = store.audit()[-1]
    assert rec.reason == "circuit-open" and rec.extra == {"failures": 3} and rec.id == rid


def test_running_job_without_allocation_is_impossible(store: Store) -> None:
    j = store.submit(["x"])
    conn = sqlite3.connect(store.path)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (j,))
    conn.close()


def test_decisions_table(store: Store) -> None:
    store.append_decision("place", {"job": "j-1", "pool": "p"}, applied=True, job="j-1", policy="ppo")
    store.append_decision("scale", {"pool": "spot", "delta": 1}, applied=False, reason="cannot grow")
    rows = store.decisions()
    assert [r["kind"] for r in rows] == ["place", "scale"]
    assert rows[0]["payload"] == {"job": "j-1", "pool": "p"} and rows[1]["applied"] is False
    assert store.decisions(since=rows[0]["id"])[0]["kind"] == "scale"


def test_many_threads(store: Store) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [store.submit(["t"]) for _ in range(40)]
        with lock:
            ids.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 320 and len(store.jobs()) == 320
    assert store.check_invariants() == []


_WRITER = textwrap.dedent("""
    import sys
    from rlsched.runtime.store import Store
    s = Store(sys.argv[1])
    tag = sys.argv[2]
    for i in range(int(sys.argv[3])):
        s.submit(["job", tag, str(i)], idempotency_key=f"{tag}-{i}")
    print("ok", flush=True)
""")


@pytest.mark.slow
def test_eight_processes_by_500_submissions(tmp_path: Path) -> None:
    db = tmp_path / "db"
    Store(db).close()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(db), f"p{k}", "500"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(8)]
    for p in procs:
        _out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    with Store(db) as s:
        jobs = s.jobs()
        assert len(jobs) == 4000 and len({j.id for j in jobs}) == 4000
        assert {tuple(j.argv) for j in jobs} == {("job", f"p{k}", str(i)) for k in range(8) for i in range(500)}
        assert s.counts()["queued"] == 4000
        assert s.check_invariants() == []


_CHURN = textwrap.dedent("""
    import random, sys
    from rlsched.runtime.store import Allocation, Store
    s = Store(sys.argv[1])
    rng = random.Random(int(sys.argv[2]))
    i = 0
    while True:
        i += 1
        jid = s.submit(["job", sys.argv[2], str(i)], idempotency_key=f"{sys.argv[2]}-{i}")
        print("submitted", jid, flush=True)   # acknowledged only after the commit
        for q in s.queued()[:2]:
            s.mark_running(q.id, Allocation("n", (f"GPU-{i}",)), pid=i, pid_start=i)
        for r in s.holding()[:2]:
            k = rng.random()
            if k < 0.3:
                s.mark_finished(r.id, rng.choice([0, 1]))
            elif k < 0.5:
                s.requeue(r.id, "preempted")
            elif k < 0.6 and r.state.value == "running":
                s.preempt(r.id)
            elif k < 0.7:
                s.cancel(r.id)
        s.append_audit("policy-switch", reason="churn", extra={"i": i})
""")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_leaves_a_consistent_database(tmp_path: Path, seed: int) -> None:
    db = tmp_path / "db"
    acked: list[str] = []
    max_audit = 0
    for round_ in range(2):  # kill, reopen, churn again on the same file, kill again
        proc = subprocess.Popen([sys.executable, "-c", _CHURN, str(db), f"{seed}{round_}"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        target = 20 + 17 * seed + 11 * round_
        n = 0
        for line in proc.stdout:
            if line.startswith("submitted"):
                acked.append(line.split()[1])
                n += 1
                if n >= target:
                    break
        time.sleep(0.003 * seed)  # land somewhere inside the next transactions
        os.kill(proc.pid, signal.SIGKILL)
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err
        acked += [ln.split()[1] for ln in rest.splitlines() if ln.startswith("submitted")]

        with Store(db) as s:
            assert s.check_invariants() == []
            jobs = {j.id: j for j in s.jobs()}
            missing = [a for a in acked if a not in jobs]
            assert not missing, f"acknowledged submissions lost: {missing}"
            for j in jobs.values():
                assert (j.allocation is not None) or not j.state.holds_gpus
                if j.state is JobState.QUEUED:
                    assert j.allocation is None and j.pid is None
            audit = s.audit()
            ids = [r.id or 0 for r in audit]
            assert ids == sorted(set(ids))  # strictly increasing
            assert ids[0] > 0 and (not max_audit or ids[-1] >= max_audit)
            submitted = {r.job for r in audit if r.event is AuditEvent.SUBMISSION}
            assert submitted == set(jobs)  # every job's submission is audited and vice versa
            new_id = s.append_audit(AuditEvent.POLICY_SWITCH, reason="after-restart")
            assert new_id > ids[-1]  # never reused
            max_audit = new_id
            # the idempotency key makes a client's retry of an unacknowledged submission safe
            rec = s.get(acked[-1])
            assert rec is not None and rec.idempotency_key is not None
            assert s.submit(list(rec.argv), idempotency_key=rec.idempotency_key) == rec.id
            json.dumps([a.to_dict() for a in audit[-5:]])


def test_batch_is_one_transaction_with_per_change_savepoints(store: Store) -> None:
    a, b = store.submit(["a"]), store.submit(["b"])
    with store.batch():
        store.mark_running(a, ALLOC, None, None)
        with pytest.raises(InvalidTransitionError):
            store.mark_finished(b, 0)  # b is queued: refused, and only this change is undone
        rec, new = store.submit_record(JobRequest(["c"], idempotency_key="k"))
        again, new2 = store.submit_record(JobRequest(["c"], idempotency_key="k"))  # sees the batch's own insert
        # Another connection does not see any of it before the commit.
        other = sqlite3.connect(store.path)
        assert other.execute("SELECT state FROM jobs WHERE id = ?", (a,)).fetchone()[0] == "queued"
        other.close()
    assert new and not new2 and again.id == rec.id
    assert rec == store.get(rec.id)  # the record built in memory is the stored one
    got = store.get(a)
    assert got is not None and got.state is JobState.RUNNING
    with pytest.raises(RuntimeError), store.batch():
        store.mark_finished(a, 0)
        store.submit(["d"])
        raise RuntimeError("boom")  # everything in the block is rolled back
    got = store.get(a)
    assert got is not None and got.state is JobState.RUNNING
    assert len(store.jobs()) == 3 and store.check_invariants() == []


def test_listing_is_bounded_by_its_limit_and_pages_back(store: Store) -> None:
    ids = [store.submit(["true"], priority=i) for i in range(40)]
    for i, job in enumerate(ids[:30]):
        store.mark_running(job, ALLOC, None, None)
        store.mark_finished(job, 0 if i % 3 else 1)
    store.cancel(ids[30])
    every = store.jobs()
    for states in (None, [JobState.DONE], [JobState.DONE, JobState.FAILED, JobState.CANCELLED],
                   [JobState.QUEUED, JobState.CANCELLED]):
        full = [r.id for r in store.jobs(states)]
        assert [r.id for r in store.jobs(states, limit=7)] == full[-7:]
        assert [r.id for r in store.jobs(states, limit=1000)] == full
        assert store.jobs(states, limit=0) == []
        # paging back with the seq of each page's first job visits every job once, in order
        pages: list[str] = []
        before: int | None = None
        while True:
            page = store.jobs(states, limit=4, before=before)
            pages[:0] = [r.id for r in page]
            if len(page) < 4:
                break
            before = page[0].seq
        assert pages == full
    assert [r.id for r in store.jobs(before=every[10].seq)] == [r.id for r in every[:10]]
    assert store.jobs(before=2**70) == every  # a cursor past the end is not an error


def test_a_limited_listing_reads_only_its_page(tmp_path: Path) -> None:
    """SQLite's own count of rows stepped through: a page of 5 among 5,000 finished jobs reads ~5 rows per state."""
    store = Store(tmp_path / "big.db", synchronous="NORMAL")
    conn = store._conn()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO jobs (id, argv, num_gpus, gpu_milli, state, submitted_at, finished_at) "
                     "VALUES (?, '[\"true\"]', 1, 1000, ?, ?, ?)",
                     [(f"j-{i:016x}", "done" if i % 2 else "failed", i, i + 1.0) for i in range(5000)])
    conn.execute("COMMIT")
    steps: list[int] = []
    conn.set_progress_handler(lambda: steps.append(1) and 0, 100)  # called every 100 VM instructions
    try:
        page = store.jobs([JobState.DONE, JobState.FAILED, JobState.CANCELLED], limit=5)
    finally:
        conn.set_progress_handler(None, 0)
    assert [r.seq for r in page] == [4996, 4997, 4998, 4999, 5000]
    assert len(steps) < 50, len(steps)  # reading and sorting all 5,000 rows takes thousands
    store.close()


def test_prune_finished_by_age_and_count(tmp_path: Path) -> None:
    clock = [1000.0]
    store = Store(tmp_path / "p.db", clock=lambda: clock[0])
    ids = [store.submit(["true"]) for _ in range(8)]
    for i, job in enumerate(ids[:6]):
        clock[0] = 1000.0 + 10 * i
        store.mark_running(job, ALLOC, None, None)
        store.mark_finished(job, 0)
    store.mark_running(ids[6], ALLOC, None, None)  # running and queued jobs are never pruned
    audit_before = len(store.audit(limit=100000))
    assert [p.id for p in store.prune_finished(finished_before=1015.0)] == ids[:2]  # finished at 1000, 1010
    assert [p.id for p in store.prune_finished(keep=3)] == [ids[2]]
    assert store.prune_finished(keep=3, finished_before=0.0) == []
    pruned = store.prune_finished(keep=0, limit=2)  # batches of at most ``limit``
    assert [p.id for p in pruned] == ids[3:5] and {p.state for p in pruned} == {JobState.DONE}
    assert [r.id for r in store.jobs()] == ids[5:]
    assert len(store.audit(limit=100000)) == audit_before  # the trail is kept
    assert store.check_invariants() == []
    store.close()
