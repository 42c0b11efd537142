"""Load: 10,000 submissions from 16 concurrent HTTP clients against ``rlsched serve`` on a 64-GPU sim fleet.

Checks: every submission is accepted (201) with a distinct id, every id is in the
store exactly once with exactly one submission audit record, the store's
invariants hold, and - replaying the audit trail - no GPU was ever held by two
jobs at once, while the service was launching and finishing jobs under the load.

Not every job is run to completion: each job is a real process under the
executor's Python wrapper (30-40 ms of CPU for the two processes), so 10,000 of
them need minutes on a 2-core runner. Seven of the eight nodes are therefore
filled with long jobs first, so whole-GPU submissions queue; one submission in
50 asks for a MIG 1g.10gb instance instead, and the MIG node's four such
instances churn through those `true` jobs concurrently with the submissions
(200 allocations and completions): what the double-allocation check needs.

Measured on a shared 2-core box: 10,000 submissions take minutes, not seconds,
because every scheduling pass re-reads the whole queue under the service lock
(see BENCHMARKS.md); ``RLSCHED_LOAD_JOBS`` lowers the count for a quick run.
The state dir is on /dev/shm where available: the test is about concurrency, not
the disk's fsync latency (``benchmarks/service_throughput.py`` measures both).
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
MIG_EVERY = 50
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
    sleepers = []
    for _ in range(8):
        status, _, raw = http("POST", s.url + "/v1/jobs", token=token,
                              body={"argv": ["sleep", "600"], "gpus": 8, "priority": 1000})
        assert status == 201, raw
        sleepers.append(json.loads(raw)["id"])

    def sleepers_run() -> bool:
        _, _, raw = http("GET", s.url + "/v1/jobs?state=running", token=token)
        return len(json.loads(raw)) == 8

    wait_for(sleepers_run, what="the long jobs to start")
    ids: list[str] = []
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
            with lock:
                if status == 201:
                    ids.append(json.loads(raw)["id"])
                else:
                    failures.append(f"{status}: {raw[:200]!r}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(N_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    print(f"\n{N_JOBS} submissions from {N_CLIENTS} clients in {elapsed:.1f} s = {N_JOBS / elapsed:.0f}/s",
          file=sys.stderr)
    try:
        assert failures == [], failures[:5]
        assert len(ids) == N_JOBS and len(set(ids)) == N_JOBS

        def completed() -> int:
            _, _, raw = http("GET", s.url + "/v1/info", token=token, timeout=60)
            jobs = json.loads(raw)["jobs"]
            return int(jobs["done"]) if jobs["done"] >= -(-N_JOBS // MIG_EVERY) else 0

        done = wait_for(completed, timeout=300, interval=1.0, what="every MIG job to complete")
        print(f"{done} jobs completed {time.monotonic() - t0:.1f} s after the first submission", file=sys.stderr)
        for j in sleepers:
            http("POST", f"{s.url}/v1/jobs/{j}/cancel", token=token)
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]
    assert "Traceback" not in s.log_text(), s.log_text()[-5000:]

    from rlsched.runtime.store import Store

    with Store(state / "jobs.db") as store:
        assert store.check_invariants() == []
        rows = store.jobs()
        assert sorted(r.id for r in rows) == sorted(ids + sleepers)  # nothing lost, nothing extra
        trail = store.audit(limit=None)
    subs = Counter(r.job for r in trail if r.event.value == "submission")
    assert set(subs) == set(ids + sleepers) and set(subs.values()) == {1}
    # Replay the trail: a device is taken by an allocation and given back by the job's completion,
    # cancellation (stage "stopped") or requeue; it must never be taken twice.
    holder: dict[str, str] = {}
    held_by: dict[str, tuple[str, ...]] = {}
    allocations = 0
    for r in trail:
        ev = r.event.value
        if ev == "allocation":
            allocations += 1
            for dev in r.gpus:
                assert dev not in holder, f"{dev} given to {r.job} while {holder[dev]} holds it (audit id {r.id})"
                holder[dev] = str(r.job)
            held_by[str(r.job)] = r.gpus
        elif ev == "completion" or (ev in ("preemption", "cancel") and r.extra.get("stage") in ("requeued", "stopped")):
            for dev in held_by.pop(str(r.job), ()):
                if holder.get(dev) == r.job:
                    del holder[dev]
    assert allocations >= -(-N_JOBS // MIG_EVERY) + 8
