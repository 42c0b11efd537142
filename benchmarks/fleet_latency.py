"""Fleet runtime on Ray: submit-to-start latency, start rate, and memory at 4, 16 and 64 simulated nodes.

Starts a real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a CPU-only head
labelled ``rlsched/agent=false`` and ``--ray-nodes`` worker nodes, default 4), gives each worker node its
own simulated fleet file through the node's environment (``RLSCHED_AGENT_BACKEND=sim:PATH``,
``RLSCHED_AGENT_STATE_DIR``), and drives the scheduler service with ``backend=ray:ADDRESS`` - every
inventory, launch, poll and log copy goes through the node agent actors. One machine cannot hold 64 Ray
nodes: the simulated nodes are split evenly over the worker nodes, so one agent manages several simulated
nodes (64 nodes = 4 agents of 16 nodes each). All job processes (and the agents, the raylets and the
service) share this machine's cores.

Jobs are ``sh -c 'date +%s.%N; sleep S'``: the first thing each prints is the wall time it started (the
equivalent of ``print(time.time())`` without a Python start-up); latency = that minus the wall time just
before ``submit`` was called. Per node count, each repeat (a new service and state dir on the same
cluster) measures:

* ``idle``: ``--singles`` jobs of 1 GPU submitted one at a time into an idle fleet, each after the previous
  one ended: p50/p95 submit-to-start latency;
* ``fill``: one 1-GPU job per GPU (capped at ``--burst-cap``), each sleeping ``--fill-sleep`` s, all
  submitted at once: p50/p95 submit-to-start latency, and the time until the last one started;
* ``over``: jobs asking ``--over`` times the fleet's GPUs in all, that only print the time, submitted at
  once: 1-GPU jobs while that makes at most ``2 * --burst-cap`` jobs, else ``2 * --burst-cap`` jobs of
  ``k`` GPUs each (``k`` the smallest power of two that fits: 4 GPUs each at 64 nodes), so the burst stays
  twice the fleet with a bounded number of processes. Reported: scheduling decisions per second
  (placements, from the store's ``started_at``, over the time from the first submission to the last
  placement), job processes started per second (from the printed start times, same origin), and the time
  until every job ended. With Ray, also the service's agent calls per job of the fill burst, by method
  (counted by wrapping ``AgentDirectory.call`` and ``fan_out`` in this process).

The service runs in this process (``SchedulerService``) for these. Memory is measured once per node count
afterwards, on ``rlsched serve --backend ray:ADDRESS`` as a subprocess (loopback HTTP, its own state dir)
after it ran the ``over`` workload: its VmRSS and VmHWM, and VmRSS / VmHWM of one agent actor process
(the agent's pid from its ``hello()``; agents are detached actors, so they also served the in-process
repeats before). ``--baseline`` runs the same workload at the first node count on ``backend=sim:FLEET``
(the local executor, no Ray) for comparison, its memory on ``rlsched serve --backend sim:FLEET``.

Each worker Ray node gets ``num_cpus=1`` (agents reserve no Ray resources anyway); the head ``num_cpus=1``.
Every cluster is shut down before the next node count and on the way out.

Examples (the BENCHMARKS.md numbers)::

    python benchmarks/fleet_latency.py --nodes 4 16 64 --repeat 3 --baseline --json fleet.json
    python benchmarks/fleet_latency.py --nodes 4 --repeat 1 --singles 3      # a quick smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.sim_backend import build_fleet, write_json_atomic
from rlsched.runtime.store import JobState
from rlsched.service.config import ServiceConfig
from rlsched.service.service import SchedulerService

GPUS_PER_NODE = 8
MODEL = "A100-80GB"
FAMILY = "a100"
ENDED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)

SPEC = """
pool "train" {
  gpu_model     = "%(model)s"
  nodes         = [%(nodes)s]
  gpus_per_node = %(gpus)d
  mig           = "disabled"
}

policy "default" {
  scheduler = "fifo"
  fallback  = "fifo"
}
"""


# ---------------------------------------------------------------------- helpers
def rss_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process in MiB."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":", 1)
            vals[k] = round(int(v.split()[0]) / 1024, 1)
    return vals


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank rule, in ms (rounded)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))
    return round(s[k] * 1000, 1)


def job(sleep_s: float) -> list[str]:
    """A job that prints its start wall time first, then sleeps."""
    return ["sh", "-c", "date +%s.%N" + (f"; sleep {sleep_s:g}" if sleep_s > 0 else "")]


def printed_start(log_path: str | None) -> float | None:
    """The start time a job printed (the first line of its log that reads as a float)."""
    if not log_path:
        return None
    with contextlib.suppress(OSError):
        for line in Path(log_path).read_text().splitlines():
            with contextlib.suppress(ValueError):
                return float(line.strip())
    return None


def write_fleets(root: Path, nodes: int, ray_nodes: int) -> tuple[list[Path], list[str], Path]:
    """One fleet file per Ray worker node (``nodes / ray_nodes`` simulated nodes each, distinct hostnames),
    the list of every hostname, and one file with all of them (the ``sim:`` baseline)."""
    files, hosts, every = [], [], {"nodes": []}  # type: ignore[var-annotated]
    per = nodes // ray_nodes
    for i in range(ray_nodes):
        data = build_fleet(f"{per}x{GPUS_PER_NODE}x{MODEL}", hostname_prefix=f"r{i}")
        path = root / f"fleet-r{i}.json"
        write_json_atomic(path, data)
        files.append(path)
        hosts.extend(n["hostname"] for n in data["nodes"])
        every["nodes"].extend(data["nodes"])
        every["version"] = data["version"]
    whole = root / "fleet-all.json"
    write_json_atomic(whole, every)
    return files, hosts, whole


def write_spec(path: Path, hosts: list[str]) -> Path:
    path.write_text(SPEC % {"model": MODEL, "gpus": GPUS_PER_NODE, "nodes": ", ".join(f'"{h}"' for h in hosts)})
    return path


@contextlib.contextmanager
def ray_cluster(root: Path, fleets: list[Path]) -> Iterator[str]:
    """A head (no agent) and one worker node per fleet file; its address. Shut down on the way out."""
    import ray
    from ray.cluster_utils import Cluster

    from rlsched import ray_connect

    ray_connect.disconnect()
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "labels": {"rlsched/agent": "false"}})
    try:
        for i, fleet in enumerate(fleets):
            cluster.add_node(num_cpus=1, env_vars={"RLSCHED_AGENT_BACKEND": f"sim:{fleet}",
                                                   "RLSCHED_AGENT_STATE_DIR": str(root / f"agent-r{i}")})
        cluster.wait_for_nodes()
        yield str(cluster.address)
    finally:
        ray_connect.disconnect()
        with contextlib.suppress(Exception):
            ray.shutdown()
        with contextlib.suppress(Exception):
            cluster.shutdown()


def wait_until(pred: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------- the in-process measurements
def submit_all(svc: SchedulerService, argv: list[str], n: int, gpus: int = 1) -> list[tuple[str, float]]:
    """Submit ``n`` jobs of ``gpus`` GPUs back to back; (job id, wall time just before its submit)."""
    out = []
    for _ in range(n):
        t = time.time()
        out.append((svc.submit(JobRequest(argv, gpus=gpus)).id, t))
    return out


def over_shape(gpus: int, args: argparse.Namespace) -> tuple[int, int]:
    """(jobs, GPUs per job) of the over burst: ``--over`` times the fleet, at most ``2 * --burst-cap`` jobs."""
    want, cap, per = args.over * gpus, 2 * args.burst_cap, 1
    while want // per > cap and per < GPUS_PER_NODE:
        per *= 2
    return want // per, per


def unfinished(svc: SchedulerService) -> int:
    """Jobs of this service not ended yet (one count query: polling every record would load the CPU)."""
    ended = {s.value for s in ENDED}
    return sum(n for state, n in svc.store.counts().items() if state not in ended)


def wait_ended(svc: SchedulerService, ids: list[str], timeout: float) -> list[Any]:
    """Wait until every job ended (each phase starts on an idle service, so that is every job of ``ids``);
    their records, all DONE or an error."""
    wait_until(lambda: unfinished(svc) == 0, timeout, f"{len(ids)} jobs to end", interval=0.05)
    recs = [svc.store.get(i) for i in ids]
    bad = [r for r in recs if r is None or r.state is not JobState.DONE]
    if bad:
        raise SystemExit(f"{len(bad)} jobs did not end DONE, e.g. {bad[0]}")
    return recs


def latencies(svc: SchedulerService, submitted: list[tuple[str, float]], timeout: float) -> tuple[
        list[float], list[Any]]:
    """Submit-to-start latencies (s) of submitted jobs once they ended, and their records."""
    recs = wait_ended(svc, [i for i, _ in submitted], timeout)
    out = []
    for (_, t), rec in zip(submitted, recs, strict=True):
        started = wait_until(lambda r=rec: printed_start(r.log_path), 10, f"the start time in {rec.log_path}")
        out.append(started - t)
    return out, recs


@contextlib.contextmanager
def counting_agent_calls() -> Iterator[dict[str, int]]:
    """Count the service's calls to its agents by method (``call`` one agent, ``fan_out`` to all): how many
    Ray round trips a job costs. Wraps :class:`~rlsched.runtime.fleet.directory.AgentDirectory` while it runs."""
    from rlsched.runtime.fleet.directory import AgentDirectory

    counts: dict[str, int] = {}
    call, fan_out = AgentDirectory.call, AgentDirectory.fan_out

    def counted_call(self: AgentDirectory, ref: Any, method: str, *a: Any, **kw: Any) -> Any:
        counts[method] = counts.get(method, 0) + 1
        return call(self, ref, method, *a, **kw)

    def counted_fan_out(self: AgentDirectory, refs: list[Any], method: str, *a: Any) -> dict[str, Any]:
        counts[f"{method} (all agents)"] = counts.get(f"{method} (all agents)", 0) + 1
        return fan_out(self, refs, method, *a)

    AgentDirectory.call, AgentDirectory.fan_out = counted_call, counted_fan_out  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        AgentDirectory.call, AgentDirectory.fan_out = call, fan_out  # type: ignore[method-assign]


def measure(backend: str, spec: Path, state: Path, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    """One repeat on a fresh service (see the module doc)."""
    with counting_agent_calls() as calls:
        out = measure_phases(backend, spec, state, gpus, args, calls)
    # the machine's 1-minute load average when the repeat ended: other work on it shows up here
    out["load_1m"] = float(Path("/proc/loadavg").read_text().split()[0])
    return out


def measure_phases(backend: str, spec: Path, state: Path, gpus: int, args: argparse.Namespace,
                   calls: dict[str, int]) -> dict[str, Any]:
    """The three phases of :func:`measure`; ``calls``: the agent calls so far (counted per phase)."""
    svc = SchedulerService(ServiceConfig([spec], state, backend=backend, tick_s=args.tick_ms / 1000, grace_s=1.0))
    t0 = time.monotonic()
    svc.start()
    out: dict[str, Any] = {"gpus": gpus}
    try:
        wait_until(lambda: sum(p["gpus_free"] for p in svc.info()["pools"].values()) >= gpus, 120,
                   "every GPU of the fleet to be free", interval=0.05)
        out["service_start_s"] = round(time.monotonic() - t0, 2)
        # idle: one at a time
        lat = []
        for _ in range(args.singles):
            sub = submit_all(svc, job(0), 1)
            got, _ = latencies(svc, sub, 60)
            lat.extend(got)
        out["idle_p50_ms"], out["idle_p95_ms"] = pct(lat, 0.5), pct(lat, 0.95)
        # fill: one job per GPU
        n = min(gpus, args.burst_cap)
        calls.clear()
        sub = submit_all(svc, job(args.fill_sleep), n)
        got, recs = latencies(svc, sub, 600)
        if calls:  # Ray round trips per job of the fill burst, by method (polls and log copies included)
            out["fill_agent_calls_per_job"] = {k: round(v / n, 1) for k, v in sorted(calls.items())}
        starts = [printed_start(r.log_path) or 0.0 for r in recs]
        out["fill_jobs"] = n
        out["fill_p50_ms"], out["fill_p95_ms"] = pct(got, 0.5), pct(got, 0.95)
        out["fill_last_start_s"] = round(max(starts) - sub[0][1], 2)
        # over: more jobs than GPUs, no sleep
        n, per = over_shape(gpus, args)
        sub = submit_all(svc, job(0), n, per)
        first = sub[0][1]
        out["over_submit_s"] = round(sub[-1][1] - first, 2)
        recs = wait_ended(svc, [i for i, _ in sub], 900)
        out["over_done_s"] = round(max(r.finished_at for r in recs) - first, 2)
        placed = max(r.started_at for r in recs) - first
        printed = [printed_start(r.log_path) for r in recs]
        began = max(p for p in printed if p is not None) - first
        out["over_jobs"], out["over_gpus_per_job"] = n, per
        out["decisions_per_s"] = round(n / placed, 1)
        out["starts_per_s"] = round(n / began, 1)
    finally:
        svc.close()
    return out


# ---------------------------------------------------------------------- memory on `rlsched serve`
def request(method: str, url: str, token: str, body: Any = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def serve_memory(backend: str, spec: Path, state: Path, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    """``rlsched serve`` in a subprocess runs the ``over`` workload; its memory (and an agent's, on Ray)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_") and k != "RAY_ADDRESS"}
    log = open(state.parent / f"serve-{state.name}.log", "wb")  # noqa: SIM115 - open while it runs
    proc = subprocess.Popen([sys.executable, "-m", "rlsched", "serve", str(spec), "--backend", backend,
                             "--listen", "127.0.0.1:0", "--state-dir", str(state), "--tick-ms", str(args.tick_ms),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env)
    out: dict[str, Any] = {}
    try:
        def announced() -> tuple[str, str] | None:
            if proc.poll() is not None:
                raise SystemExit(f"serve exited: {log.name}")
            with contextlib.suppress(OSError, ValueError, KeyError):
                info = json.loads((state / "server.json").read_text())
                if info["pid"] == proc.pid:
                    return str(info["url"]), (state / "token").read_text().strip()
            return None

        url, token = wait_until(announced, 120, "rlsched serve to start", interval=0.1)
        time.sleep(1.0)
        idle = rss_mib(proc.pid)
        out["serve_idle_rss_mib"] = idle.get("VmRSS")
        n, per = over_shape(gpus, args)
        for _ in range(n):
            status, raw = request("POST", url + "/v1/jobs", token, {"argv": job(0), "gpus": per})
            if status != 201:
                raise SystemExit(f"submit: {status} {raw[:200]!r}")

        def ended() -> bool:
            jobs = json.loads(request("GET", url + "/v1/info", token)[1])["jobs"]
            return bool(jobs["done"] + jobs["failed"] >= n)

        wait_until(ended, 900, "the serve workload to end", interval=0.5)
        mem = rss_mib(proc.pid)
        out["serve_rss_mib"], out["serve_hwm_mib"] = mem.get("VmRSS"), mem.get("VmHWM")
        if backend.startswith("ray:"):
            import ray

            from rlsched.ray_connect import NAMESPACE, connect

            connect(backend[4:])
            named = cast(list[dict[str, str]], ray.util.list_named_actors(all_namespaces=True))
            agents = [a["name"] for a in named if a["name"].startswith("agent-") and a["namespace"] == NAMESPACE]
            hellos = [cast(dict[str, Any], ray.get(ray.get_actor(name, namespace=NAMESPACE).hello.remote(),
                                                   timeout=30)) for name in agents]
            pids = [int(h["pid"]) for h in hellos]
            mems = [rss_mib(p) for p in pids]
            out["agents"] = len(pids)
            out["agent_rss_mib"] = max(m.get("VmRSS", 0.0) for m in mems)
            out["agent_hwm_mib"] = max(m.get("VmHWM", 0.0) for m in mems)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return out


# ---------------------------------------------------------------------- driver
def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}


def run_size(nodes: int, args: argparse.Namespace, root: Path, baseline: bool) -> list[dict[str, Any]]:
    """Every measurement at one node count (the Ray runs, then the ``sim:`` baseline if asked)."""
    ray_nodes = min(args.ray_nodes, nodes)
    if nodes % ray_nodes:
        raise SystemExit(f"--nodes {nodes}: not a multiple of --ray-nodes {ray_nodes}")
    here = root / f"n{nodes}"
    here.mkdir()
    fleets, hosts, whole = write_fleets(here, nodes, ray_nodes)
    spec = write_spec(here / "pool.hcl", hosts)
    gpus = nodes * GPUS_PER_NODE
    results = []
    with ray_cluster(here, fleets) as address:
        runs = []
        for i in range(args.repeat):
            r = measure(f"ray:{address}", spec, here / f"state-{i}", gpus, args)
            print(json.dumps({"backend": "ray", "nodes": nodes, "ray_nodes": ray_nodes, "run": i, **r}), flush=True)
            runs.append(r)
        mem = serve_memory(f"ray:{address}", spec, here / "state-serve", gpus, args) if args.memory else {}
        print(json.dumps({"backend": "ray", "nodes": nodes, "memory": mem}), flush=True)
        results.append({"backend": "ray", "nodes": nodes, "ray_nodes": ray_nodes,
                        "median": {**medians(runs), **mem}, "runs": runs})
    if baseline:
        runs = []
        for i in range(args.repeat):
            r = measure(f"sim:{whole}", spec, here / f"sim-state-{i}", gpus, args)
            print(json.dumps({"backend": "sim", "nodes": nodes, "run": i, **r}), flush=True)
            runs.append(r)
        mem = serve_memory(f"sim:{whole}", spec, here / "sim-state-serve", gpus, args) if args.memory else {}
        print(json.dumps({"backend": "sim", "nodes": nodes, "memory": mem}), flush=True)
        results.append({"backend": "sim", "nodes": nodes, "median": {**medians(runs), **mem}, "runs": runs})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 16, 64], help="simulated node counts (8 GPUs each)")
    ap.add_argument("--ray-nodes", type=int, default=4, help="Ray worker nodes (one agent each)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per node count; the medians are reported")
    ap.add_argument("--singles", type=int, default=5, help="jobs submitted one at a time into an idle fleet")
    ap.add_argument("--fill-sleep", type=float, default=2.0, help="seconds each job of the fill burst sleeps")
    ap.add_argument("--over", type=int, default=2, help="the over burst: this many jobs per GPU")
    ap.add_argument("--burst-cap", type=int, default=128,
                    help="at most this many jobs in the fill burst, twice as many in the over burst")
    ap.add_argument("--tick-ms", type=float, default=250.0, help="the service's loop period (its default)")
    ap.add_argument("--baseline", action="store_true", help="also run the first node count on sim: (no Ray)")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the rlsched serve phase")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (state, logs, fleet files)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rlsched-fleet-bench-"))
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    try:
        for k, nodes in enumerate(args.nodes):
            results.extend(run_size(nodes, args, root, args.baseline and k == 0))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    for r in results:
        print(json.dumps({"median": r["median"], "backend": r["backend"], "nodes": r["nodes"]}))
    print(json.dumps({"wall_s": round(time.monotonic() - t0, 1)}))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                        indent=1))


if __name__ == "__main__":
    main()
