"""Scheduler service throughput and memory: submissions per second over HTTP, RSS after many jobs.

Starts ``rlsched serve`` (a real subprocess, sim fleet, loopback) and drives it
with concurrent HTTP clients (stdlib ``urllib``, one connection per request, like
``rlsched submit``; ``--connection keep-alive``: one persistent connection per
client thread; ``both``: one burst each, new connections first). Reports:

* submissions/s sustained by ``--clients`` threads for ``--jobs`` submissions;
* the service's RSS (``VmRSS``) before, right after the submissions, and after the
  jobs completed (``--wait``), plus its peak (``VmHWM``);
* with ``--wait``: how long the service took to run every job to completion.

``--job true`` runs each job as a real process (the executor's wrapper + ``true``);
``--job hold`` first fills every GPU with a long job, so every submission stays
queued (the queue grows to ``--jobs``): submission cost with a deep queue.

Examples (the BENCHMARKS.md numbers)::

    python benchmarks/service_throughput.py --jobs 10000 --clients 16 --job hold
    python benchmarks/service_throughput.py --jobs 100000 --clients 16 --job hold
    python benchmarks/service_throughput.py --jobs 2000 --clients 16 --job true --wait
    python benchmarks/service_throughput.py --jobs 2000 --clients 1 --job hold --connection both
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SPEC = """
pool "train" {
  gpu_model = "H100-80GB"
  nodes     = [%(nodes)s]
  mig       = "disabled"
}

policy "default" {
  scheduler = "%(scheduler)s"
  fallback  = "fifo"
}
"""


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":", 1)
            vals[k] = int(v.split()[0]) / 1024
    return vals.get("VmRSS", 0.0), vals.get("VmHWM", 0.0)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far (its own threads, not its children)."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    fields = raw[raw.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request(method: str, url: str, token: str, body: Any = None, timeout: float = 120) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class KeepAlive:
    """One persistent HTTP/1.1 connection (what a long-lived client or a proxy uses), reconnecting if dropped."""

    def __init__(self, url: str, token: str) -> None:
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.token = u.hostname or "127.0.0.1", u.port or 80, token
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            try:
                self.conn.request(method, path, body=data, headers={
                    "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def start(root: Path, nodes: int, gpus: int, scheduler: str, tick_ms: float, extra: list[str]) -> tuple[
        subprocess.Popen[bytes], str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rlsched.runtime.sim_backend import build_fleet, write_json_atomic

    fleet = root / "fleet.json"
    data = build_fleet(f"{nodes}x{gpus}xH100-80GB")
    write_json_atomic(fleet, data)
    hosts = [n["hostname"] for n in data["nodes"]]
    spec = root / "pool.hcl"
    spec.write_text(SPEC % {"nodes": ", ".join(f'"{h}"' for h in hosts), "scheduler": scheduler})
    state = root / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_")}
    launcher = os.environ.get("RLSCHED_BENCH_LAUNCHER")  # e.g. a profiling wrapper script
    head = [sys.executable, launcher] if launcher else [sys.executable, "-m", "rlsched"]
    log = open(root / "serve.log", "wb")  # noqa: SIM115 - the service's output, open while it runs
    proc = subprocess.Popen([*head, "serve", str(spec), "--backend", f"sim:{fleet}",
                             "--listen", "127.0.0.1:0", "--state-dir", str(state), "--tick-ms", str(tick_ms),
                             "--log-level", "warning", *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited: {(root / 'serve.log').read_text()[-2000:]}")
        try:
            info = json.loads((state / "server.json").read_text())
            if info["pid"] == proc.pid:
                return proc, info["url"], (state / "token").read_text().strip()
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("serve did not start")


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="rlsched-bench-", dir="/dev/shm" if args.tmpfs else None))
    proc, url, token = start(root, args.nodes, args.gpus_per_node, args.scheduler, args.tick_ms, args.serve_arg)
    out: dict[str, Any] = {"jobs": args.jobs, "clients": args.clients, "job": args.job, "tmpfs": args.tmpfs,
                           "gpus": args.nodes * args.gpus_per_node}
    try:
        time.sleep(1.0)
        out["rss_idle_mib"] = rss_mib(proc.pid)[0]
        body: dict[str, Any] = {"argv": ["true"], "gpus": 1}
        if args.job == "hold":
            # fill every GPU with a long job first: the submissions then queue behind them
            for _ in range(args.nodes):
                status, raw = request("POST", url + "/v1/jobs", token, {"argv": ["sleep", "3600"],
                                                                        "gpus": args.gpus_per_node})
                assert status == 201, raw
            while json.loads(request("GET", url + "/v1/info", token)[1])["running"] < args.nodes:
                time.sleep(0.2)
        lock = threading.Lock()
        errors: list[str] = []

        def burst(keep_alive: bool) -> tuple[float, list[float]]:
            """Submit ``args.jobs`` jobs from ``args.clients`` threads; (wall seconds, latencies)."""
            remaining = [args.jobs]
            lat: list[float] = []

            def client() -> None:
                mine: list[float] = []
                conn = KeepAlive(url, token) if keep_alive else None
                try:
                    while True:
                        with lock:
                            if remaining[0] <= 0:
                                break
                            remaining[0] -= 1
                        t = time.perf_counter()
                        if conn is not None:
                            status, raw = conn.request("POST", "/v1/jobs", body)
                        else:
                            status, raw = request("POST", url + "/v1/jobs", token, body)
                        mine.append(time.perf_counter() - t)
                        if status != 201:
                            with lock:
                                errors.append(f"{status} {raw[:200]!r}")
                finally:
                    if conn is not None:
                        conn.close()
                with lock:
                    lat.extend(mine)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=client) for _ in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return time.perf_counter() - t0, sorted(lat)

        def summary(wall: float, lat: list[float]) -> dict[str, float]:
            return {"submit_wall_s": round(wall, 2), "submissions_per_s": round(args.jobs / wall, 1),
                    "latency_p50_ms": round(statistics.median(lat) * 1000, 1),
                    "latency_p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 1)}

        cpu0 = cpu_s(proc.pid)
        t0 = time.perf_counter()
        modes = {"new": [False], "keep-alive": [True], "both": [False, True]}[args.connection]
        for keep_alive in modes:
            wall, lat = burst(keep_alive)
            part = summary(wall, lat)
            if len(modes) > 1:
                out["keep_alive" if keep_alive else "new_connections"] = part
            out.update(part)
        out["errors"] = len(errors)
        out["rss_after_submit_mib"] = rss_mib(proc.pid)[0]
        out["service_cpu_submit_s"] = round(cpu_s(proc.pid) - cpu0, 2)
        if errors:
            out["first_error"] = errors[0]
        if args.wait and args.job == "true":
            t1 = time.perf_counter()
            while True:
                status, raw = request("GET", url + "/v1/info", token)
                jobs = json.loads(raw)["jobs"]
                if jobs["done"] + jobs["failed"] >= args.jobs:
                    break
                time.sleep(1.0)
            out["all_done_after_s"] = round(time.perf_counter() - t0, 1)
            out["drain_after_submit_s"] = round(time.perf_counter() - t1, 1)
            out["rss_after_done_mib"] = rss_mib(proc.pid)[0]
            out["service_cpu_total_s"] = round(cpu_s(proc.pid) - cpu0, 2)
        out["rss_peak_mib"] = rss_mib(proc.pid)[1]
        out["db_mib"] = round(sum(f.stat().st_size for f in (root / "state").glob("jobs.db*")) / 2**20, 1)
    finally:
        if args.job == "hold":
            with contextlib.suppress(Exception):
                for j in json.loads(request("GET", url + "/v1/jobs?state=running", token)[1]):
                    request("POST", f"{url}/v1/jobs/{j['id']}/cancel", token)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            out["dir"] = str(root)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--job", choices=["true", "hold"], default="hold")
    ap.add_argument("--wait", action="store_true", help="with --job true: wait until every job has run")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--scheduler", default="fifo")
    ap.add_argument("--tick-ms", type=float, default=250.0)
    ap.add_argument("--repeat", type=int, default=1, help="runs; the medians are reported")
    ap.add_argument("--tmpfs", action="store_true",
                    help="state dir in /dev/shm: no fsync cost (shows the CPU-bound rate; not durable)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (state, serve.log)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for rlsched serve")
    ap.add_argument("--connection", choices=["new", "keep-alive", "both"], default="new",
                    help="one connection per request (like `rlsched submit`), one persistent connection per "
                         "client thread, or both in turn (--jobs each) on the same service")
    args = ap.parse_args()
    runs = [run(args) for _ in range(args.repeat)]
    for r in runs:
        print(json.dumps(r), flush=True)
    if len(runs) > 1:
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}
        print(json.dumps({"median": med}))


if __name__ == "__main__":
    main()
