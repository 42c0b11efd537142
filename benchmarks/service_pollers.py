"""Submission latency and submit-to-start time while clients poll a service with a long history.

Fills a state dir with ``--history`` finished jobs (rows and audit records as the
service writes them, inserted directly: building them through the API would take
minutes), starts ``rlsched serve`` on it (real subprocess, sim fleet of 8x8 H100,
fifo, loopback), then, for each poller count in ``--pollers``:

* ``N`` poller processes loop on what ``rlsched status`` and a dashboard ask: the
  active jobs, the last 20 finished ones (``GET /v1/jobs?state=...&limit=20``) and
  ``GET /v1/info``, each on a new connection like the CLI;
* one submitter sends ``--jobs`` one-GPU ``true`` jobs at ``--rate`` per second.

Reported per poller count: submit latency p50/p99 (HTTP round trip of ``POST
/v1/jobs``), submit-to-start p50/p99 (the job's ``started_at - submitted_at`` as
the service recorded them: queueing plus the scheduling pass), and the pollers'
request latency p50/p99 and requests served.

Example (the BENCHMARKS.md numbers)::

    python benchmarks/service_pollers.py --history 100000 --pollers 0 --pollers 4 --jobs 300
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service_throughput import request, start


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` in milliseconds, rounded."""
    if not values:
        return float("nan")
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q * len(s)) - 1))] * 1000, 1)


def fill_history(db: Path, n: int) -> None:
    """``n`` finished jobs with their submission, allocation and completion audit records."""
    from rlsched.runtime.store import Store

    store = Store(db, synchronous="NORMAL")
    conn = store._conn()
    now = time.time() - 86400
    conn.execute("BEGIN")
    jobs, audit = [], []
    alloc = json.dumps({"node": "gpu-h100-01", "devices": ["GPU-0"], "pool": "train", "gpu_indices": [0],
                        "slice_start": None})
    for i in range(n):
        jid = f"j-{uuid.uuid4().hex[:16]}"
        t = now + i * 0.5
        state = "done" if i % 10 else "failed"
        jobs.append((jid, json.dumps(["python", "train.py", "--seed", str(i)]), state, t, t + 1, t + 60, alloc,
                     0 if state == "done" else 1))
        audit += [(t, "submission", jid, "[]", "{}"), (t + 1, "allocation", jid, '["GPU-0"]', "{}"),
                  (t + 60, "completion", jid, '["GPU-0"]', json.dumps({"state": state}))]
    conn.executemany("INSERT INTO jobs (id, argv, num_gpus, gpu_milli, state, submitted_at, started_at, finished_at, "
                     "allocation, exit_code, attempts, user) VALUES (?, ?, 1, 1000, ?, ?, ?, ?, ?, ?, 1, 'bench')",
                     jobs)
    conn.executemany("INSERT INTO audit (time, event, job, gpus, extra) VALUES (?, ?, ?, ?, ?)", audit)
    conn.execute("COMMIT")
    store.close()


def poller(url: str, token: str, stop: Any, out: Any) -> None:
    """One polling client (its own process, like a CLI or a dashboard): loop until ``stop`` is set."""
    mine: list[float] = []
    paths = ["/v1/jobs?state=queued&state=running&state=preempted",
             "/v1/jobs?state=done&state=failed&state=cancelled&limit=20", "/v1/info"]
    i = 0
    while not stop.is_set():
        t = time.perf_counter()
        status, raw = request("GET", url + paths[i % len(paths)], token)
        mine.append(time.perf_counter() - t)
        if status != 200:
            raise SystemExit(f"poll failed: {status} {raw[:200]!r}")
        i += 1
    out.put(mine)


def run_phase(url: str, token: str, pollers: int, jobs: int, rate: float) -> dict[str, Any]:
    stop = multiprocessing.Event()
    results: Any = multiprocessing.Queue()
    poll_lat: list[float] = []
    procs = [multiprocessing.Process(target=poller, args=(url, token, stop, results)) for _ in range(pollers)]
    for pr in procs:
        pr.start()
    time.sleep(1.0 if pollers else 0.0)
    ids: list[str] = []
    submit_lat: list[float] = []
    t0 = time.perf_counter()
    for k in range(jobs):
        target = t0 + k / rate
        if (wait := target - time.perf_counter()) > 0:
            time.sleep(wait)
        t = time.perf_counter()
        status, raw = request("POST", url + "/v1/jobs", token, {"argv": ["true"], "gpus": 1})
        submit_lat.append(time.perf_counter() - t)
        assert status == 201, raw[:200]
        ids.append(json.loads(raw)["id"])
    # wait until every job has started (then finished: `true`), reading each one's recorded times
    deadline = time.monotonic() + 600
    starts: list[float] = []
    pending = list(ids)
    while pending and time.monotonic() < deadline:
        still = []
        for jid in pending:
            _, raw = request("GET", f"{url}/v1/jobs/{jid}", token)
            j = json.loads(raw)
            if j.get("started_at"):
                starts.append(j["started_at"] - j["submitted_at"])
            else:
                still.append(jid)
        pending = still
        if pending:
            time.sleep(0.5)
    stop.set()
    for _ in procs:
        poll_lat.extend(results.get(timeout=120))
    for pr in procs:
        pr.join(60)
    return {"pollers": pollers, "jobs": jobs, "not_started": len(pending),
            "submit_p50_ms": pct(submit_lat, 0.5), "submit_p99_ms": pct(submit_lat, 0.99),
            "submit_to_start_p50_ms": pct(starts, 0.5), "submit_to_start_p99_ms": pct(starts, 0.99),
            "poll_requests": len(poll_lat), "poll_p50_ms": pct(poll_lat, 0.5), "poll_p99_ms": pct(poll_lat, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=100_000, help="finished jobs in the store before the start")
    ap.add_argument("--pollers", type=int, action="append", help="poller threads (repeat: one phase each)")
    ap.add_argument("--jobs", type=int, default=300, help="submissions per phase")
    ap.add_argument("--rate", type=float, default=20.0, help="submissions per second")
    ap.add_argument("--tick-ms", type=float, default=250.0)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (state, serve.log)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rlsched-pollers-"))
    try:
        (root / "state").mkdir(mode=0o700)
        t = time.perf_counter()
        fill_history(root / "state" / "jobs.db", args.history)
        print(json.dumps({"history": args.history, "fill_s": round(time.perf_counter() - t, 1)}), flush=True)
        proc, url, token = start(root, 8, 8, "fifo", args.tick_ms, ["--log-level", "warning"])
        try:
            for n in args.pollers or [0, 4]:
                print(json.dumps(run_phase(url, token, n, args.jobs, args.rate)), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    finally:
        if args.keep:
            print(json.dumps({"dir": str(root)}))
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
