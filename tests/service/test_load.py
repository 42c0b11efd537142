"""Load: 10,000 submissions from 16 concurrent HTTP clients against ``rlsched serve``, with jobs running.

The fleet is the sim backend's 8 x 8 H100 nodes plus an H100 node with 2 MIG GPUs
(4 x 1g.10gb, 2 x 2g.20gb, 2 x 3g.40gb), all free. Every submission is a real job
(``true`` under the executor's wrapper): 6 in 7 ask for one GPU, 1 in 7 for two,
1 in 50 for a MIG 1g.10gb instance, with mixed priorities and users; 1 in 500 is
cancelled by its client right after it was accepted. The service places and runs
jobs while the submissions pour in, so allocations, completions, cancels and new
submissions interleave under the service lock, the group commit and the launches.

Checks:

* every submission is accepted (201) with a distinct id, and every id is in the
  store exactly once, with exactly one submission audit record; nothing extra;
* at least ``MIN_DONE`` jobs ran to completion (the rest may stay queued: every
  job is a real pair of processes, ~40-100 ms of CPU, so all 10,000 would take
  minutes on a 2-core runner);
* replaying the audit trail, no GPU or MIG instance was ever given to a job while
  another held it;
* exactly once: each job's launches (one exit file per wrapper) equal its
  allocations and attempts; no job was allocated twice (nothing is preempted
  here); a done job has exactly one completion record; cancelled jobs ended
  cancelled (or had already finished);
* ``Store.check_invariants`` is clean, and the service logged no traceback.

``RLSCHED_LOAD_JOBS`` / ``RLSCHED_LOAD_MIN_DONE`` change the counts for a quick
run. The state dir is on /dev/shm where available: the test is about concurrency,
not the disk's fsync latency (``benchmarks/service_throughput.py`` measures both).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from .serving import http, start_serve, wait_for, write_workspace

N_JOBS = int(os.environ.get("RLSCHED_LOAD_JOBS", "10000"))
MIN_DONE = min(N_JOBS, int(os.environ.get("RLSCHED_LOAD_MIN_DONE", "1000")))
MIG_EVERY = 50
CANCEL_EVERY = 500
N_CLIENTS = 16


@pytest.mark.slow
def test_10k_concurrent_submissions(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path, train_nodes=8, gpus_per_node=8)
    shm = Path(tempfile.mkdtemp(prefix="rlsched-load-", dir="/dev/shm")) if os.path.isdir("/dev/shm") else None
    state = (shm or tmp_path) / "state"
    try:
        run_load(spec, fleet, state)
    finally:
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)


def run_load(spec: Path, fleet: Path, state: Path) -> None:
    s = start_serve(spec, fleet, state, "--log-level", "warning")
    token = s.token
    ids: list[str] = []
    cancelled: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()
    counter = iter(range(N_JOBS))

    def client(k: int) -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            body: dict[str, object] = {"argv": ["true"], "priority": i % 5, "user": f"u{k}"}
            if i % MIG_EVERY == 0:
                body["mig"] = "1g.10gb"
            else:
                body["gpus"] = 1 + (i % 7 == 0)
            key = f"load-{i}-{uuid.uuid4().hex[:8]}"
            try:
                status, _, raw = http("POST", s.url + "/v1/jobs", token=token, body=body,
                                      headers={"Idempotency-Key": key}, timeout=60)
            except OSError as exc:
                status, raw = -1, str(exc).encode()
            if status != 201:
                with lock:
                    failures.append(f"{status}: {raw[:200]!r}")
                continue
            job = json.loads(raw)["id"]
            with lock:
                ids.append(job)
            if i % CANCEL_EVERY == CANCEL_EVERY - 1:
                status, _, raw = http("POST", f"{s.url}/v1/jobs/{job}/cancel", token=token, timeout=60)
                with lock:
                    (cancelled.append(job) if status == 200 else failures.append(f"cancel {status}: {raw[:200]!r}"))

    def info() -> dict[str, int]:
        _, _, raw = http("GET", s.url + "/v1/info", token=token, timeout=60)
        return dict(json.loads(raw)["jobs"])

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(N_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    try:
        at_end = info()
        print(f"\n{N_JOBS} submissions from {N_CLIENTS} clients in {elapsed:.1f} s = {N_JOBS / elapsed:.0f}/s; "
              f"{at_end['done']} jobs done by then", file=sys.stderr)
        assert failures == [], failures[:5]
        assert len(ids) == N_JOBS and len(set(ids)) == N_JOBS
        wait_for(lambda: info()["done"] >= MIN_DONE, timeout=600, interval=0.5, what=f"{MIN_DONE} jobs to complete")
        took = time.monotonic() - t0
        done = info()["done"]
        print(f"{done} jobs done {took:.1f} s after the first submission ({done / took:.0f}/s)", file=sys.stderr)
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]
    assert "Traceback" not in s.log_text(), s.log_text()[-5000:]

    from rlsched.runtime.executor import proc_start_time
    from rlsched.runtime.store import JobState, Store

    with Store(state / "jobs.db") as store:
        # Jobs still marked running when the service stopped are `true`: let their wrappers finish.
        for rec in store.holding():
            wait_for(lambda r=rec: r.pid is None or proc_start_time(r.pid) != r.pid_start, timeout=120,
                     what=f"job {rec.id} to exit")
        assert store.check_invariants() == []
        rows = {r.id: r for r in store.jobs()}
        trail = store.audit(limit=None)
    assert sorted(rows) == sorted(ids)  # nothing lost, nothing extra
    subs = Counter(r.job for r in trail if r.event.value == "submission")
    assert set(subs) == set(ids) and set(subs.values()) == {1}
    # Replay the trail: a device is taken by an allocation and given back by the job's completion,
    # cancellation (stage "stopped") or requeue; it must never be taken twice.
    holder: dict[str, str] = {}
    held_by: dict[str, tuple[str, ...]] = {}
    allocations: Counter[str] = Counter()
    completions: Counter[str] = Counter()
    mig_allocations = 0
    for r in trail:
        ev = r.event.value
        if ev == "allocation":
            allocations[str(r.job)] += 1
            mig_allocations += any(d.startswith("MIG-") for d in r.gpus)
            for dev in r.gpus:
                assert dev not in holder, f"{dev} given to {r.job} while {holder[dev]} holds it (audit id {r.id})"
                holder[dev] = str(r.job)
            held_by[str(r.job)] = r.gpus
        elif ev == "completion" or (ev in ("preemption", "cancel") and r.extra.get("stage") in ("requeued", "stopped")):
            completions[str(r.job)] += ev == "completion"
            for dev in held_by.pop(str(r.job), ()):
                if holder.get(dev) == r.job:
                    del holder[dev]
    # Exactly once: one wrapper (= one exit file) per allocation, nothing allocated twice.
    exits = Counter(p.name.split(".", 1)[0] for p in (state / "logs").glob("*.exit.json*") if ".tmp" not in p.name)
    for jid, rec in rows.items():
        assert allocations[jid] == rec.attempts <= 1, (jid, allocations[jid], rec.attempts)
        if rec.state.holds_gpus and rec.pid is None:
            # Marked running by the last pass, stopped before its launch was recorded: launched at most once.
            assert exits[jid] <= allocations[jid], (jid, exits[jid], allocations[jid])
        else:
            assert exits[jid] == allocations[jid], (jid, exits[jid], allocations[jid])
        if rec.state is JobState.DONE:
            assert completions[jid] == 1 and rec.exit_code == 0, rec
    done = sum(r.state is JobState.DONE for r in rows.values())
    assert done >= MIN_DONE and mig_allocations > 0
    assert all(rows[j].state in (JobState.CANCELLED, JobState.DONE) for j in cancelled), \
        [(j, rows[j].state) for j in cancelled if rows[j].state not in (JobState.CANCELLED, JobState.DONE)]
    print(f"allocations {sum(allocations.values())} (MIG {mig_allocations}), done {done}, "
          f"cancelled {sum(r.state is JobState.CANCELLED for r in rows.values())}, "
          f"queued {sum(r.state is JobState.QUEUED for r in rows.values())}", file=sys.stderr)
