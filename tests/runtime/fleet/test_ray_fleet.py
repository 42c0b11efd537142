"""The live service on a real multi-node Ray cluster: placement, gangs, MIG, node loss, restarts, scale.

Every test drives the real parts: a ``ray.cluster_utils.Cluster`` with three worker nodes (see
conftest), one node agent actor per node over its own simulated fleet, the scheduler service (in this
process, or ``rlsched serve`` in a subprocess where it gets killed), and real job processes. Jobs print
``RLSCHED_AGENT_BACKEND``, which each Ray node's environment sets to its own fleet file: it proves which
node's agent started them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlsched.runtime.audit import AuditEvent
from rlsched.runtime.job_request import JobRequest
from rlsched.runtime.store import JobState
from rlsched.service.config import ServiceConfig
from rlsched.service.service import SchedulerService
from tests.runtime.fleet.conftest import PY, RayFleet, alive, wait_for

CLI = [sys.executable, "-m", "rlsched"]
WHO = ("import os; print('ran-by', os.environ.get('RLSCHED_AGENT_BACKEND'), 'devices', "
       "os.environ['CUDA_VISIBLE_DEVICES'], 'rank', os.environ.get('RLSCHED_GANG_RANK', '-'))")


#: how long the jobs of the lost-node test sleep (they are fenced or cancelled long before)
STRAY_S = 3600


def sleeper(seconds: float) -> list[str]:
    return [PY, "-c", f"import time; time.sleep({seconds})"]


@contextlib.contextmanager
def service(fleet: RayFleet, root: Path, **kw: Any) -> Iterator[SchedulerService]:
    spec = fleet.spec(root / "pool.hcl")
    kw.setdefault("grace_s", 1.0)
    kw.setdefault("tick_s", 0.05)
    svc = SchedulerService(ServiceConfig([spec], root / "state", backend=f"ray:{fleet.address}", **kw))
    svc.start()
    try:
        yield svc
    finally:
        for rec in svc.store.holding():
            with contextlib.suppress(Exception):
                svc.cancel(rec.id)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not list(svc.store.holding()), timeout=30, what="cancelled jobs to end")
        svc.close()


def finished(svc: SchedulerService, job_id: str) -> bool:
    return svc.store.get(job_id).state in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


def node_fleet(fleet: RayFleet, host: str) -> str:
    return str(fleet.fleets[next(k for k, v in fleet.hosts.items() if v == host)])


def cli(*args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLSCHED_BACKEND", "RAY_ADDRESS")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


# ---------------------------------------------------------------------- inventory, plan, bad input
def test_inventory_spans_the_nodes_and_plan_reads_it(ray_fleet: RayFleet, tmp_path: Path) -> None:
    from rlsched.runtime.select import get_backend

    be = get_backend(f"ray:{ray_fleet.address}")
    nodes = {n.hostname: n for n in be.inventory()}
    assert set(nodes) == set(ray_fleet.hosts.values())
    assert [len(nodes[ray_fleet.hosts[k]].gpus) for k in "abc"] == [4, 4, 2]
    assert all(n.reachable for n in nodes.values()) and be.problems() == []
    out = cli("plan", str(ray_fleet.spec(tmp_path / "pool.hcl")), "--backend", f"ray:{ray_fleet.address}")
    assert out.returncode == 0, out.stderr
    # every GPU of the three nodes is read through its agent and already matches the spec
    assert "Plan: 10 to adopt, 6 to add, 0 to change, 0 to destroy." in out.stdout, out.stdout
    for host in ray_fleet.hosts.values():
        assert f'node "{host}"' in out.stdout


def test_bad_ray_addresses_are_one_line_errors(tmp_path: Path) -> None:
    spec = tmp_path / "pool.hcl"
    spec.write_text('pool "p" {\n  gpu_model = "A100-80GB"\n  nodes = ["x"]\n}\n')
    started = time.monotonic()
    for backend, msg in (("ray:127.0.0.1:1", "cannot reach a Ray head there"),
                         ("ray:nowhere", "expected 'auto' (this machine) or HOST:PORT")):
        out = cli("plan", str(spec), "--backend", backend, timeout=60)
        assert out.returncode != 0 and msg in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2, out.stderr
    assert time.monotonic() - started < 120  # no wait for a head that is not there (a guard, not a target)


def test_a_node_without_nvml_is_unknown_with_its_reason(ray_fleet: RayFleet, tmp_path: Path) -> None:
    from rlsched.runtime.select import get_backend

    ray_fleet.add("d", env={"RLSCHED_AGENT_BACKEND": "nvml", "RLSCHED_AGENT_HOSTNAME": "gpu-no-driver",
                            "RLSCHED_AGENT_STATE_DIR": str(ray_fleet.root / "agent-d")})
    try:
        ray_fleet.cluster.wait_for_nodes()
        be = get_backend(f"ray:{ray_fleet.address}")
        nodes = {n.hostname: n for n in be.inventory()}
        assert not nodes["gpu-no-driver"].reachable
        assert all(nodes[h].reachable for h in ray_fleet.hosts.values())
        problems = be.problems()  # type: ignore[attr-defined]
        assert len(problems) == 1 and "NVML" in problems[0], problems
        with service(ray_fleet, tmp_path) as svc:  # the live service audits it, once
            wait_for(lambda: [r for r in svc.store.audit() if r.reason == "agent-problem"], what="the audit")
            svc.tick()
            recs = [r for r in svc.store.audit() if r.reason == "agent-problem"]
            assert len(recs) == 1 and "NVML" in recs[0].extra["problem"]
    finally:
        ray_fleet.remove("d")


def test_a_node_that_cannot_import_the_agent_is_one_line(ray_fleet: RayFleet, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from rlsched.runtime.fleet.directory import AgentDirectory

    # a class importable here but not on the Ray nodes: what a node without rlsched installed does
    (tmp_path / "agent_elsewhere.py").write_text("class Agent:\n    def hello(self):\n        return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import agent_elsewhere  # type: ignore[import-not-found]

    ray_fleet.add("e", env={**ray_fleet.env("a"), "RLSCHED_AGENT_STATE_DIR": str(ray_fleet.root / "agent-e")})
    try:
        ray_fleet.cluster.wait_for_nodes()
        d = AgentDirectory(ray_fleet.address, agent_class=agent_elsewhere.Agent)
        d.refresh()
        problems = list(d.problems.values())
        assert len(problems) == 1, problems
        assert "the agent cannot be imported there (ModuleNotFoundError: No module named 'agent_elsewhere')" \
            in problems[0] and "install rlsched" in problems[0] and "\n" not in problems[0]
    finally:
        ray_fleet.remove("e")


# ---------------------------------------------------------------------- placement
def test_jobs_run_on_the_chosen_node_with_its_uuids(ray_fleet: RayFleet, tmp_path: Path) -> None:
    with service(ray_fleet, tmp_path) as svc:
        jobs = [svc.submit(JobRequest([PY, "-c", WHO], gpus=2)) for _ in range(4)]
        jobs.append(svc.submit(JobRequest([PY, "-c", WHO], mig="3g.40gb")))
        wait_for(lambda: all(finished(svc, j.id) for j in jobs), what="jobs to finish")
        used = set()
        for j in jobs:
            rec = svc.store.get(j.id)
            assert rec.state is JobState.DONE and rec.attempts == 1, (rec.state, rec.reason)
            assert rec.allocation is not None
            text = Path(rec.log_path or "").read_text()
            devices = ",".join(rec.allocation.devices)
            assert f"ran-by sim:{node_fleet(ray_fleet, rec.allocation.node)} devices {devices} rank -" in text, text
            used.add(rec.allocation.node)
        assert used == set(ray_fleet.hosts.values())  # both A100 nodes and the MIG node


def test_a_gang_spans_two_nodes_one_process_each(ray_fleet: RayFleet, tmp_path: Path) -> None:
    with service(ray_fleet, tmp_path) as svc:
        job = svc.submit(JobRequest([PY, "-c", WHO], gpus=8))
        wait_for(lambda: finished(svc, job.id), what="the gang to finish")
        rec = svc.store.get(job.id)
        assert rec.state is JobState.DONE and rec.allocation is not None
        assert len(rec.allocation.devices) == 8
        text = Path(rec.log_path or "").read_text()
        a, b = ray_fleet.hosts["a"], ray_fleet.hosts["b"]
        lead, member = (a, b) if rec.allocation.node == a else (b, a)
        assert f"ran-by sim:{node_fleet(ray_fleet, lead)} devices " in text and " rank 0" in text, text
        assert f"[rank 1 {member}] ran-by sim:{node_fleet(ray_fleet, member)} devices " in text, text
        # status shows each node's own devices, not all eight under the leader
        from rlsched.report.jobs import devices_text

        by_node = svc.job_status(job.id)["allocation"]["by_node"]
        assert set(by_node) == {a, b} and all(len(v) == 4 for v in by_node.values())
        assert devices_text(svc.job_status(job.id)).count(": ") == 2


def test_a_gang_ends_with_its_last_rank(ray_fleet: RayFleet, tmp_path: Path) -> None:
    code = ("import os, time\n"
            "if os.environ['RLSCHED_GANG_RANK'] == '1': time.sleep(3); print('member done', flush=True)\n")
    with service(ray_fleet, tmp_path) as svc:
        job = svc.submit(JobRequest([PY, "-c", code], gpus=8))
        wait_for(lambda: finished(svc, job.id), timeout=60, what="the gang to end")
        rec = svc.store.get(job.id)
        assert rec.state is JobState.DONE and rec.exit_code == 0  # the leader left at once, the member ran on
        assert "member done" in Path(rec.log_path or "").read_text()
        assert rec.finished_at is not None and rec.started_at is not None and rec.finished_at - rec.started_at >= 2.5


def test_a_failing_gang_member_stops_its_leader(ray_fleet: RayFleet, tmp_path: Path) -> None:
    code = ("import os, sys, time\n"
            "if os.environ['RLSCHED_GANG_RANK'] == '1': sys.exit(3)\n"
            "time.sleep(120)\n")
    with service(ray_fleet, tmp_path) as svc:
        job = svc.submit(JobRequest([PY, "-c", code], gpus=8))
        wait_for(lambda: finished(svc, job.id), timeout=60, what="the gang to stop")
        rec = svc.store.get(job.id)
        assert rec.state is JobState.FAILED and rec.exit_code == -signal.SIGTERM, (rec.state, rec.exit_code)


# ---------------------------------------------------------------------- MIG
def test_mig_apply_across_nodes_drains_a_busy_node_first(ray_fleet: RayFleet, tmp_path: Path) -> None:
    from rlsched.runtime.select import get_backend

    backend = f"ray:{ray_fleet.address}"
    spec = ray_fleet.spec(tmp_path / "pool.hcl", resplit=True)
    plan = cli("plan", str(spec), "--backend", backend)
    assert plan.returncode == 0 and "1g.10gb" in plan.stdout, plan.stdout + plan.stderr
    be = get_backend(backend)
    c = ray_fleet.hosts["c"]
    slice_ = next(n for n in be.inventory() if n.hostname == c).gpus[0].mig_devices[0].uuid
    ex = be.job_executor(tmp_path / "jobs" / "logs")  # type: ignore[attr-defined]
    try:
        job = ex.on(c).launch("busy-c", [PY, "-c", "import time; time.sleep(4); print('done', flush=True)"],
                              [slice_])
        out = cli("apply", str(spec), "--backend", backend, "--auto-approve", "--no-serve")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"node.{c}: Draining" in out.stdout, out.stdout
        assert ex.poll(job) == 0  # it ended before its GPU was re-split, never killed by the apply
    finally:
        ex.close()
    for label, per_gpu in (("b", 7), ("c", 7)):
        fleet = json.loads(ray_fleet.fleets[label].read_text())
        layouts = [[d["profile"] for d in g["mig_devices"]] for g in fleet["nodes"][0]["gpus"]]
        assert layouts == [["1g.10gb"] * per_gpu] * len(layouts), (label, layouts)
    back = cli("apply", str(ray_fleet.spec(tmp_path / "pool.hcl")), "--backend", backend, "--auto-approve",
               "--no-serve")
    assert back.returncode == 0, back.stdout + back.stderr
    assert not json.loads(ray_fleet.fleets["b"].read_text())["nodes"][0]["gpus"][0]["mig_current"]


def test_cancel_of_a_remote_job_terms_then_kills(ray_fleet: RayFleet, tmp_path: Path) -> None:
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('term', flush=True)); "
                "print('up', flush=True); time.sleep(120)")
    with service(ray_fleet, tmp_path, grace_s=1.0) as svc:
        job = svc.submit(JobRequest([PY, "-c", stubborn], gpus=1))
        log = wait_for(lambda: svc.store.get(job.id).log_path, what="the launch")
        wait_for(lambda: "up" in Path(log).read_text() if Path(log).exists() else False, what="output copied home")
        svc.cancel(job.id)
        wait_for(lambda: finished(svc, job.id), timeout=60, what="the cancel")
        rec = svc.store.get(job.id)
        assert rec.state is JobState.CANCELLED and rec.attempts == 1
        assert "term" in Path(log).read_text()  # SIGTERM first; SIGKILL after the grace period


# ---------------------------------------------------------------------- faults
def test_a_lost_node_requeues_or_loses_its_jobs_once_and_is_fenced_when_back(
        ray_fleet: RayFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSCHED_NODE_LOST_AFTER_S", "2")
    a, b = ray_fleet.hosts["a"], ray_fleet.hosts["b"]
    # the jobs sleep far longer than the test takes on a loaded machine: a stray that ended by itself
    # before its node came back would leave nothing to fence (a 300 s sleep did, under load)
    with service(ray_fleet, tmp_path) as svc:
        filler = svc.submit(JobRequest(sleeper(STRAY_S), gpus=4))
        wait_for(lambda: svc.store.get(filler.id).pid is not None, what="the filler to start")
        hold_a = svc.store.get(filler.id).allocation
        assert hold_a is not None
        victim_host = b if hold_a.node == a else a
        label = "b" if victim_host == b else "a"
        keep = svc.submit(JobRequest(sleeper(STRAY_S), gpus=2, preemptible=True))
        lose = svc.submit(JobRequest(sleeper(STRAY_S), gpus=2))
        wait_for(lambda: all(svc.store.get(j.id).pid is not None for j in (keep, lose)), what="jobs to start")
        old = {j.id: svc.store.get(j.id).pid for j in (keep, lose)}
        assert all(svc.store.get(j.id).allocation.node == victim_host for j in (keep, lose))  # type: ignore[union-attr]
        ray_fleet.remove(label)
        try:
            wait_for(lambda: svc.store.get(lose.id).state is JobState.FAILED, timeout=120, what="the job lost")
            wait_for(lambda: svc.store.get(keep.id).state is JobState.QUEUED, timeout=60, what="the requeue")
            assert "lost" in svc.store.get(lose.id).reason and victim_host in svc.store.get(keep.id).reason
            from rlsched.service.board import FleetBoard

            node_view = next(n for n in FleetBoard(svc).fleet()["nodes"] if n["hostname"] == victim_host)
            assert node_view["status"] == "unknown"
            assert all(alive(p) for p in old.values() if p), "the strays must outlive their agent to be fenced"
        finally:
            ray_fleet.add(label)
        # back: the old processes (they outlived their agent) are fenced, the requeued job runs again there
        wait_for(lambda: not any(alive(p) for p in old.values() if p), timeout=120, what="strays fenced")
        wait_for(lambda: svc.store.get(keep.id).state is JobState.RUNNING and svc.store.get(keep.id).pid,
                 timeout=120, what="the requeued job to run again")
        rec = svc.store.get(keep.id)
        assert rec.attempts == 2 and rec.pid not in old.values()
        assert svc.store.get(lose.id).attempts == 1
        events = [(r.reason, r.job) for r in svc.store.audit() if r.event is AuditEvent.NODE]
        assert ("node-lost", keep.id) in events and ("node-lost", lose.id) in events
        hosts = [(r.reason, r.extra.get("node")) for r in svc.store.audit() if r.event is AuditEvent.NODE and not r.job]
        assert ("node-unreachable", victim_host) in hosts and ("node-returned", victim_host) in hosts, hosts
        # a fence is audited after the agent's kill returns, and a stray the agent killed before a new
        # attempt (superseded) at the next loop round: the processes can be gone before their records
        fenced = {("fenced", keep.id), ("fenced", lose.id)}
        wait_for(lambda: fenced <= {(r.reason, r.job) for r in svc.store.audit() if r.event is AuditEvent.NODE},
                 timeout=60, what="both fences audited")


# ---------------------------------------------------------------------- the service as a process
def start_serve(fleet: RayFleet, spec: Path, state_dir: Path, log_name: str = "serve.log") -> tuple[Any, str, str]:
    """``rlsched serve --backend ray:ADDR`` on a free loopback port: (process, url, token) once it answers."""
    from tests.service.serving import clean_env, http

    log = state_dir.parent / log_name
    with open(log, "ab") as out:
        proc = subprocess.Popen([*CLI, "serve", str(spec), "--backend", f"ray:{fleet.address}", "--listen",
                                 "127.0.0.1:0", "--state-dir", str(state_dir), "--tick-ms", "50", "--grace", "2"],
                                stdout=out, stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True)

    def up() -> tuple[str, str] | None:
        assert proc.poll() is None, f"rlsched serve exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        with contextlib.suppress(OSError, ValueError):
            info = json.loads((state_dir / "server.json").read_text())
            if info.get("pid") == proc.pid and http("GET", info["url"] + "/healthz")[0] == 200:
                return str(info["url"]), (state_dir / "token").read_text().strip()
        return None

    url, token = wait_for(up, timeout=120, interval=0.2, what="rlsched serve to answer")
    return proc, url, token


def api(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    from tests.service.serving import http

    status, _, raw = http(method, url + path, token=token, body=body)
    assert status in (200, 201, 202), (status, raw[:500])
    return json.loads(raw)


def test_service_kill9_reattaches_to_the_agents_and_their_jobs(ray_fleet: RayFleet, tmp_path: Path) -> None:
    from tests.service.serving import clean_env

    spec = ray_fleet.spec(tmp_path / "pool.hcl")
    state = tmp_path / "state"
    proc, url, token = start_serve(ray_fleet, spec, state)
    code = ("import os, sys, time; print('start', flush=True); time.sleep(6); "
            "print('end', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)")
    ids = [api(url, token, "POST", "/v1/jobs", {"argv": [PY, "-c", code], "gpus": 2})["id"] for _ in range(3)]
    wait_for(lambda: all(api(url, token, "GET", f"/v1/jobs/{j}")["state"] == "running" for j in ids),
             what="jobs to run")
    nodes = {api(url, token, "GET", f"/v1/jobs/{j}")["allocation"]["node"] for j in ids}
    assert len(nodes) == 2  # 3 x 2 GPUs over the two 4-GPU nodes
    # "running" is recorded when a job is placed, before its agent has launched it; a kill in between
    # leaves a job that never started, which the next service rightly launches (attempt 2). This test is
    # about processes that run on under their agents, so it kills once each job's process has printed.

    def started(j: str) -> bool:
        log = state / "logs" / f"{j}.log"
        return log.is_file() and "start\n" in log.read_text()

    wait_for(lambda: all(started(j) for j in ids), what="every job's process to start")
    os.killpg(proc.pid, signal.SIGKILL)  # the service and nothing else: the jobs run under the agents
    proc.wait(30)
    proc, url, token = start_serve(ray_fleet, spec, state, "serve2.log")
    try:
        wait_for(lambda: all(api(url, token, "GET", f"/v1/jobs/{j}")["state"] == "done" for j in ids),
                 what="adopted jobs to finish")
        for j in ids:
            view = api(url, token, "GET", f"/v1/jobs/{j}")
            assert view["attempts"] == 1, view  # re-adopted, never started twice
            devices = ",".join(view["allocation"]["devices"])
            follow = subprocess.run([*CLI, "logs", "--follow", j], capture_output=True, text=True, timeout=120,
                                    env=clean_env(RLSCHED_SERVER=url, RLSCHED_TOKEN=token))
            assert follow.returncode == 0 and "start\n" in follow.stdout and f"end {devices}\n" in follow.stdout
            assert follow.stdout.count("start\n") == 1, follow.stdout
        audit = api(url, token, "GET", "/v1/audit")
        assert not [r for r in audit if r["event"] == "node" and r.get("reason") == "fenced"]

        # a second service on the same cluster: one line, non-zero exit; the first audits the attempt
        other = tmp_path / "other"
        out = subprocess.run([*CLI, "serve", str(spec), "--backend", f"ray:{ray_fleet.address}", "--listen",
                              "127.0.0.1:0", "--state-dir", str(other)], capture_output=True, text=True,
                             timeout=120, env=clean_env())
        assert out.returncode != 0 and "another rlsched service drives this Ray cluster" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        wait_for(lambda: any(r["event"] == "node" and r.get("reason") == "second-service-refused"
                             for r in api(url, token, "GET", "/v1/audit")), what="the refusal in the audit")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.mark.parametrize("member", ["runs on", "vanished"])
def test_service_kill9_keeps_a_running_gang_whole(ray_fleet: RayFleet, tmp_path: Path, member: str) -> None:
    # A gang survives a kill -9 of the service: its successor adopts the leader and keeps the member on the
    # other node (never fenced as a stray: that node is the job's too), and the job ends done at attempt 1.
    # If the member vanished while no service ran (its wrapper killed with it: no exit record), the leader
    # would wait at its rendezvous until the job's own timeout (here: sleeps for an hour); the successor fences
    # it and requeues the job, whose attempt 2 runs as a whole.
    spec = ray_fleet.spec(tmp_path / "pool.hcl")
    state = tmp_path / "state"
    marker = tmp_path / "ranks.txt"
    code = ("import os, time\n"
            f"open({str(marker)!r}, 'a').write('%s %s %d\\n' % (os.environ['RLSCHED_ATTEMPT'], "
            "os.environ['RLSCHED_GANG_RANK'], os.getpid()))\n"
            f"time.sleep({8 if member == 'runs on' else 3600} if os.environ['RLSCHED_ATTEMPT'] == '1' else 0)\n")
    proc, url, token = start_serve(ray_fleet, spec, state)
    job = api(url, token, "POST", "/v1/jobs", {"argv": [PY, "-c", code], "gpus": 8})["id"]

    def ranks() -> list[list[str]]:
        return [ln.split() for ln in marker.read_text().splitlines()] if marker.exists() else []

    wait_for(lambda: len(ranks()) == 2, what="both ranks of the gang to start")
    os.killpg(proc.pid, signal.SIGKILL)  # the service and nothing else: the ranks run under their agents
    proc.wait(30)
    if member == "vanished":
        pid = int(next(r for r in ranks() if r[1] == "1")[2])
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # the rank and its wrapper: no exit record is left
        wait_for(lambda: not alive(pid), what="rank 1 to vanish")
    proc, url, token = start_serve(ray_fleet, spec, state, "serve2.log")
    try:
        wait_for(lambda: api(url, token, "GET", f"/v1/jobs/{job}")["state"] in ("done", "failed"), timeout=120,
                 what="the gang to finish")
        view = api(url, token, "GET", f"/v1/jobs/{job}")
        assert view["state"] == "done", view
        audit = api(url, token, "GET", "/v1/audit")
        fenced = [r for r in audit if r["event"] == "node" and r.get("reason") == "fenced"]
        if member == "runs on":
            assert view["attempts"] == 1, view  # adopted whole, never started twice
            assert not fenced, fenced
            assert sorted(r[1] for r in ranks()) == ["0", "1"]
        else:
            assert view["attempts"] == 2, view
            assert any("never started" in json.dumps(r) for r in fenced), fenced
            assert sorted((r[0], r[1]) for r in ranks()) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_a_launch_from_a_replaced_service_starts_nothing(ray_fleet: RayFleet, tmp_path: Path) -> None:
    # A service killed with a launch still on its way to an agent; its successor (same state dir) has claimed
    # the agents before recovering, found no process and requeued the job. The late launch must start
    # nothing. The dead service's executor stands in for the launch on its way (same call, its epoch).
    from rlsched.runtime.executor import ExecutorError
    from rlsched.runtime.fleet.backend import RayBackend

    host = ray_fleet.hosts["a"]
    logs = tmp_path / "state" / "logs"
    first_backend = RayBackend(ray_fleet.address)
    dev = first_backend.node(host).gpus[0].uuid
    first = first_backend.job_executor(logs)
    second = RayBackend(ray_fleet.address).job_executor(logs)  # the restarted service takes the lease back
    try:
        assert second.epoch > first.epoch
        assert second.on(host).find("j-late") is None
        with pytest.raises(ExecutorError, match=r"launch of job j-late on .* refused: it comes from a service "
                                                r"that has been replaced"):
            first.on(host).launch("j-late", [PY, "-c", "print('ran')"], [dev])
        assert second.on(host).find("j-late") is None
        assert not [j for j in second.strays() if j[1] == "j-late"]
        h = second.on(host).launch("j-late", [PY, "-c", "print('ran')"], [dev])  # the successor's attempt runs
        wait_for(lambda: second.poll(h) is not None, what="the successor's attempt to end")
        assert second.poll(h) == 0
    finally:
        second.close()
        first.close()


@pytest.mark.parametrize("rank1", ["never started", "ended 0", "ended 3"])
def test_a_gang_adopted_after_a_restart_is_checked_rank_by_rank(
        ray_fleet: RayFleet, tmp_path: Path, rank1: str) -> None:
    # A service started rank 0 of a gang and then died. Rank 1 either never started (its launch was on its
    # way and the successor's epoch refused it) or ended while no service ran. The successor adopts the leader
    # with the job's devices. A missing rank must not leave the leader waiting at its rendezvous until the
    # job's own timeout: the gang is fenced and its poll is EXIT_LOST (the service requeues it). A rank that
    # ended keeps the gang going: successfully, the leader runs on to its own end; failed, it stops the leader.
    from rlsched.runtime.executor import EXIT_LOST, ExecutorError
    from rlsched.runtime.fleet.agent import JobLaunch
    from rlsched.runtime.fleet.backend import RayBackend

    a, b = ray_fleet.hosts["a"], ray_fleet.hosts["b"]
    logs = tmp_path / "state" / "logs"
    first_backend = RayBackend(ray_fleet.address)
    dev_a, dev_b = first_backend.node(a).gpus[0].uuid, first_backend.node(b).gpus[0].uuid
    first = first_backend.job_executor(logs)
    marker = tmp_path / "ranks.txt"
    go = tmp_path / "go"  # the leader of "ended 0" ends once the test says so (never before its adoption)
    code = {"never started": "time.sleep(3600)", "ended 3": "time.sleep(3600)",
            "ended 0": f"while not os.path.exists({str(go)!r}): time.sleep(0.1)"}[rank1]
    member = {"ended 0": "sys.exit(0)", "ended 3": "sys.exit(3)"}.get(rank1, "time.sleep(3600)")
    script = (f"import os, sys, time\nopen({str(marker)!r}, 'a').write(os.environ['RLSCHED_GANG_RANK'] + ' ' + "
              f"str(os.getpid()) + '\\n')\nif os.environ['RLSCHED_GANG_RANK'] == '1':\n    {member}\n{code}\n")
    env = {"RLSCHED_GANG_SIZE": "2", "RLSCHED_GANG_HOSTS": f"{a},{b}", "RLSCHED_GANG_LEADER": a}

    def rank(r: int, host: str, dev: str, ex: Any) -> Any:
        run = JobLaunch((PY, "-c", script), (dev,), {**env, "RLSCHED_GANG_RANK": str(r)}, None)
        return ex.launched(host, "j-gang", ex.send_launch(ex.agent(host), host, "j-gang", run), 30.0)

    second = None
    try:
        leader = rank(0, a, dev_a, first)
        wait_for(lambda: marker.exists() and marker.read_text().startswith("0 "), timeout=30, what="rank 0 to start")
        if rank1 != "never started":
            m = rank(1, b, dev_b, first)
            wait_for(lambda: first._agent_poll(m) is not None, timeout=30, what="rank 1 to end")
        second = RayBackend(ray_fleet.address).job_executor(logs)  # the successor claims every agent
        if rank1 == "never started":
            with pytest.raises(ExecutorError, match="refused"):
                rank(1, b, dev_b, first)  # the launch that was on its way arrives after the claim
        h = second.on(a).adopt(leader.pid, leader.start_time, None, "j-gang", devices=[dev_a, dev_b])
        assert h is not None and h.pid == leader.pid
        go.touch()
        rc = wait_for(lambda: (lambda x: None if x is None else [x])(second.poll(h)), timeout=60,
                      what="the adopted gang to settle")[0]
        if rank1 == "never started":
            assert rc == EXIT_LOST
            wait_for(lambda: not alive(leader.pid), timeout=30, what="the leader to be fenced")
            notes = second.notices()
            assert any(n["reason"] == "fenced" and n["node"] == a and "never started" in n["why"] for n in notes), notes
        elif rank1 == "ended 0":
            assert rc == 0  # the leader ran on to its own end
        else:
            assert rc == -signal.SIGTERM  # stopped by its failed member, as under a running service
        assert sorted(ln.split()[0] for ln in marker.read_text().splitlines()) == \
            (["0"] if rank1 == "never started" else ["0", "1"])
    finally:
        if second is not None:
            second.close()
        first.close()


@pytest.mark.slow
def test_a_thousand_submissions_run_exactly_once_across_the_nodes(ray_fleet: RayFleet, tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    argv = ["/bin/sh", "-c", 'printf "%s %s\\n" "$RLSCHED_JOB_ID" "$CUDA_VISIBLE_DEVICES" >> "$0"', str(marker)]
    with service(ray_fleet, tmp_path, tick_s=0.02) as svc:
        jobs = [svc.submit(JobRequest(argv, mig="1g.10gb") if k % 10 == 0 else JobRequest(argv, gpus=1))
                for k in range(1000)]
        wait_for(lambda: sum(svc.store.counts().get(s, 0) for s in ("done", "failed", "cancelled")) >= 1000,
                 timeout=600, interval=0.5, what="1,000 jobs to end")
        assert svc.store.counts().get("done", 0) == 1000, [(r.id, r.reason) for r in svc.store.jobs(["failed"])][:5]
        lines = marker.read_text().splitlines()
        ran = [ln.split()[0] for ln in lines]
        assert len(ran) == 1000 and set(ran) == {j.id for j in jobs}  # every job once, none twice
        by_node: dict[str, int] = {}
        for j in jobs:
            rec = svc.store.get(j.id)
            assert rec.state is JobState.DONE and rec.attempts == 1
            assert rec.allocation is not None
            by_node[rec.allocation.node] = by_node.get(rec.allocation.node, 0) + 1
            assert f"{j.id} {','.join(rec.allocation.devices)}" in lines
        assert set(by_node) == set(ray_fleet.hosts.values()) and by_node[ray_fleet.hosts["c"]] == 100


def test_a_partitioned_node_that_answers_again_keeps_its_jobs(
        ray_fleet: RayFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSCHED_NODE_LOST_AFTER_S", "120")
    with service(ray_fleet, tmp_path) as svc:
        job = svc.submit(JobRequest([PY, "-c", "import time; time.sleep(12); print('finished', flush=True)"],
                                    gpus=1))
        wait_for(lambda: svc.store.get(job.id).pid is not None, what="the job to start")
        rec = svc.store.get(job.id)
        assert rec.allocation is not None
        host = rec.allocation.node
        agent = svc.backend.directory.agent_for(host)  # type: ignore[attr-defined]
        assert agent is not None and agent.pid
        os.kill(agent.pid, signal.SIGSTOP)  # the agent stops answering; the job itself runs on
        try:
            wait_for(lambda: any(n.hostname == host and not n.reachable for n in svc.inventory.nodes),
                     timeout=60, what="the node to show unknown")
            assert svc.store.get(job.id).state is JobState.RUNNING
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        wait_for(lambda: finished(svc, job.id), timeout=120, what="the job to finish")
        rec = svc.store.get(job.id)
        assert rec.state is JobState.DONE and rec.attempts == 1  # re-adopted, not started twice
        assert "finished" in Path(rec.log_path or "").read_text()
        assert not [r for r in svc.store.audit() if r.event is AuditEvent.NODE and r.job == job.id]
        # the inventory pass that notes the node's return may come after the pass that sees the job finish

        def node_audit() -> list[str]:
            return [r.reason for r in svc.store.audit() if r.event is AuditEvent.NODE and r.extra.get("node") == host]

        wait_for(lambda: len(node_audit()) >= 2, timeout=60, what="the node's return to be audited")
        assert node_audit() == ["node-unreachable", "node-returned"]


def test_a_job_without_a_pid_on_a_silent_node_waits_for_it_and_is_adopted(
        ray_fleet: RayFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A service died between launching a job and recording its pid, and the job's node is silent when the
    # next service recovers. Requeueing it at once would run it twice (the launch did start there); it must
    # wait like any job of a silent node, and be adopted when the node answers.
    import sqlite3

    monkeypatch.setenv("RLSCHED_NODE_LOST_AFTER_S", "120")
    spec = ray_fleet.spec(tmp_path / "pool.hcl")
    config = ServiceConfig([spec], tmp_path / "state", backend=f"ray:{ray_fleet.address}", grace_s=1.0, tick_s=0.05)
    first = SchedulerService(config)
    first.start()
    job = first.submit(JobRequest([PY, "-c", "import time; print('start', flush=True); time.sleep(STRAY_S)"
                                   .replace("STRAY_S", str(STRAY_S))], gpus=1))
    wait_for(lambda: first.store.get(job.id).pid is not None, what="the job to start")
    rec = first.store.get(job.id)
    assert rec.allocation is not None
    host, pid = rec.allocation.node, rec.pid
    agent = first.backend.directory.agent_for(host)  # type: ignore[attr-defined]
    assert agent is not None and agent.pid
    first.close()  # its job runs on under its agent
    # the store as the launch's commit left it: running, without the pid the launch would have recorded
    with contextlib.closing(sqlite3.connect(config.state_dir / "jobs.db")) as db, db:
        db.execute("UPDATE jobs SET pid = NULL, pid_start = NULL WHERE id = ?", (job.id,))
    os.kill(agent.pid, signal.SIGSTOP)  # the node stops answering
    try:
        second = SchedulerService(config)
        second.start()  # recovers with the node silent
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    try:
        assert second.recovered["requeued"] == 0 and second.recovered["adopted"] == 1
        assert second.store.get(job.id).state is JobState.RUNNING and second.store.get(job.id).attempts == 1
        wait_for(lambda: second.store.get(job.id).pid == pid, timeout=60, what="the process to be adopted")
        assert alive(pid)
        second.cancel(job.id)  # a cancel reaches the adopted process
        wait_for(lambda: finished(second, job.id), timeout=60, what="the cancel")
        done = second.store.get(job.id)
        assert done.state is JobState.CANCELLED and done.attempts == 1  # adopted, never started twice
        assert Path(done.log_path or "").read_text().count("start") == 1
        wait_for(lambda: not alive(pid), what="the process to end")
        assert not [r for r in second.store.audit() if r.event is AuditEvent.NODE and r.reason == "fenced"]
    finally:
        second.close()


def test_an_unconfirmed_handle_waits_while_its_node_is_silent_and_resolves_when_it_answers(
        ray_fleet: RayFleet, tmp_path: Path) -> None:
    # The executor's side of the test above: a pid-less job's handle on a silent node, a running job's
    # (adopted once the node answers) and a never-started job's (EXIT_LOST then: the service requeues it).
    from rlsched.runtime.executor import EXIT_LOST, EXIT_NODE_LOST, UNKNOWN_PID
    from rlsched.runtime.fleet.backend import RayBackend

    host = ray_fleet.hosts["c"]
    backend = RayBackend(ray_fleet.address)
    dev = backend.node(host).gpus[0].uuid
    ex = backend.job_executor(tmp_path / "logs")
    agent = backend.directory.agent_for(host)
    assert agent is not None and agent.pid
    try:
        ran = ex.on(host).launch("j-ran", sleeper(60), [dev])
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            started, never = ex.on(host).find("j-ran"), ex.on(host).find("j-never")
            assert started is not None and never is not None
            assert started.pid == never.pid == UNKNOWN_PID and started.unconfirmed and never.unconfirmed
            assert ex.poll(started) is None and ex.poll(never) is None and ex.is_silent(host)
            again = ex.on(host).find("j-ran")  # a node known to be silent is not called again
            assert again is not None and again.pid == UNKNOWN_PID
            ex.lost_after_s = 0.0
            assert ex.poll(never) == EXIT_NODE_LOST  # a silent node's jobs are lost in the end, pid or not
            ex.lost_after_s = 120.0
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        wait_for(lambda: ex.poll(never) == EXIT_LOST, timeout=60, what="the node to answer")
        assert ex.poll(started) is None  # its process runs: the service's next pass adopts it
        found = ex.on(host).find("j-ran")
        assert found is not None and found.pid == ran.pid
        ex.send_signal(found, signal.SIGKILL)
        wait_for(lambda: ex.poll(found) is not None, what="the job to end")
    finally:
        ex.close()


def test_a_launch_its_agent_answers_late_is_waited_for_not_failed(ray_fleet: RayFleet, tmp_path: Path) -> None:
    # A busy agent (many launches at once on a loaded machine) may answer a launch after the wait; it still
    # starts the job. The launch is then neither a failure (the job would be recorded failed while it runs)
    # nor free to run again: its handle is unconfirmed until the agent answers. A launch the agent refuses
    # when it answers fails its job as a refusal answered at once would.
    from rlsched.runtime.executor import EXIT_NOT_EXECUTABLE, UNKNOWN_PID
    from rlsched.runtime.fleet.backend import RayBackend

    host = ray_fleet.hosts["a"]
    backend = RayBackend(ray_fleet.address)
    dev = backend.node(host).gpus[0].uuid
    ex = backend.job_executor(tmp_path / "logs")
    ex.launch_wait_s = 0.5
    agent = backend.directory.agent_for(host)
    assert agent is not None and agent.pid
    marker = tmp_path / "ran.txt"
    try:
        os.kill(agent.pid, signal.SIGSTOP)  # the agent takes the calls but answers none yet
        try:
            late = ex.on(host).launch("j-late", ["/bin/sh", "-c", 'echo "$RLSCHED_JOB_ID" >> "$0"', str(marker)],
                                      [dev], {"RLSCHED_JOB_ID": "j-late"})
            refused = ex.on(host).launch("j-refused", ["/bin/true"], ["GPU-not-on-this-node"])
            assert late.pid == refused.pid == UNKNOWN_PID and late.unconfirmed
            waiting = ex.on(host).find("j-late")  # no question to the agent that could overtake the launch
            assert waiting is not None and waiting.unconfirmed and ex.poll(waiting) is None
            assert not marker.exists()
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        started = wait_for(lambda: (lambda h: h if h is not None and not h.unconfirmed else None)(
            ex.on(host).find("j-late")), timeout=60, what="the agent to answer the launch")
        wait_for(lambda: ex.poll(started) is not None, what="the job to end")
        assert ex.poll(started) == 0 and marker.read_text().split() == ["j-late"]  # started once, by that launch
        wait_for(lambda: ex.on(host).find("j-refused") is None and not ex.has_unanswered("j-refused"),
                 what="the refusal")
        assert ex.on(host).recorded_exit("j-refused") == EXIT_NOT_EXECUTABLE
    finally:
        ex.close()


@pytest.mark.parametrize(("gpus", "count"), [(1, 24), (8, 3)], ids=["one-node", "gangs"])
def test_jobs_whose_launches_are_answered_late_run_once_and_end_done(
        ray_fleet: RayFleet, tmp_path: Path, gpus: int, count: int) -> None:
    # The service's side: with no wait at all for a launch's answer, every launch (a gang's too) is unconfirmed
    # when the pass records it; each job must still end done (not failed, not requeued), each process run once.
    marker = tmp_path / "ran.txt"
    argv = ["/bin/sh", "-c", 'echo "$RLSCHED_JOB_ID-${RLSCHED_GANG_RANK:-solo}" >> "$0"', str(marker)]
    ranks = ["solo"] if gpus == 1 else ["0", "1"]
    with service(ray_fleet, tmp_path, tick_s=0.02) as svc:
        svc.executor.launch_wait_s = 0.0  # type: ignore[attr-defined]
        jobs = [svc.submit(JobRequest(argv, gpus=gpus)) for _ in range(count)]
        wait_for(lambda: all(finished(svc, j.id) for j in jobs), timeout=180, what=f"{count} jobs")
        for j in jobs:
            rec = svc.store.get(j.id)
            assert rec.state is JobState.DONE and rec.attempts == 1, (rec.state, rec.reason)
        assert sorted(marker.read_text().split()) == sorted(f"{j.id}-{r}" for j in jobs for r in ranks)


def test_a_gang_whose_rank_is_answered_late_waits_for_it_and_runs_once(ray_fleet: RayFleet, tmp_path: Path) -> None:
    # A busy agent may answer a gang rank's launch after the wait. The gang is then neither failed (the old
    # behaviour: a spurious failure whose late rank had to be fenced) nor free to run again: its handle stays
    # unconfirmed until every rank answered, then the gang runs as one, each rank once.
    from rlsched.runtime.executor import UNKNOWN_PID
    from rlsched.runtime.fleet.backend import RayBackend

    a, b = ray_fleet.hosts["a"], ray_fleet.hosts["b"]
    backend = RayBackend(ray_fleet.address, call_timeout_s=1.0)
    backend.inventory()
    dev_a, dev_b = backend.node(a).gpus[0].uuid, backend.node(b).gpus[0].uuid
    ex = backend.job_executor(tmp_path / "logs")
    ex.launch_wait_s = 0.5
    agent_b = backend.directory.agent_for(b)
    assert agent_b is not None and agent_b.pid
    marker = tmp_path / "ranks.txt"
    argv = ["/bin/sh", "-c", 'echo "$RLSCHED_GANG_RANK" >> "$0"; echo "rank $RLSCHED_GANG_RANK says hello"',
            str(marker)]
    try:
        os.kill(agent_b.pid, signal.SIGSTOP)  # b takes the launch but answers nothing yet
        try:
            t0 = time.monotonic()
            h = ex.on(a).launch("j-gang", argv, [dev_a, dev_b])
            assert h.unconfirmed and h.pid == UNKNOWN_PID and h.node == a
            assert time.monotonic() - t0 < 5.0  # one wait for the gang, not a failure after it
            waiting = ex.on(a).find("j-gang")
            assert waiting is not None and waiting.unconfirmed and ex.poll(waiting) is None
        finally:
            os.kill(agent_b.pid, signal.SIGCONT)
        leader = wait_for(lambda: (lambda x: x if x is not None and not x.unconfirmed else None)(
            ex.on(a).find("j-gang")), timeout=60, what="every rank to answer")
        wait_for(lambda: ex.poll(leader) is not None, timeout=60, what="the gang to end")
        assert ex.poll(leader) == 0
        assert sorted(marker.read_text().split()) == ["0", "1"]  # each rank started once
        log = leader.log_path.read_text()
        assert "rank 0 says hello" in log and f"[rank 1 {b}] rank 1 says hello" in log, log
    finally:
        ex.close()


def test_a_gang_rank_that_never_answers_fails_the_gang_and_is_fenced_if_it_starts(
        ray_fleet: RayFleet, tmp_path: Path) -> None:
    # A rank whose agent stays silent for lost_after_s fails the gang's launch: its started ranks are fenced
    # at once and the job's recorded exit is the refusal's. That rank may still start when its agent gets to
    # the launch: nobody runs it, so it is fenced as soon as its agent answers, and audited.
    from rlsched.runtime.executor import EXIT_NOT_EXECUTABLE
    from rlsched.runtime.fleet.backend import RayBackend

    a, b = ray_fleet.hosts["a"], ray_fleet.hosts["b"]
    backend = RayBackend(ray_fleet.address, call_timeout_s=1.0)
    backend.inventory()
    dev_a, dev_b = backend.node(a).gpus[0].uuid, backend.node(b).gpus[0].uuid
    ex = backend.job_executor(tmp_path / "logs")
    ex.launch_wait_s, ex.lost_after_s = 0.5, 2.0
    agent_b = backend.directory.agent_for(b)
    assert agent_b is not None and agent_b.pid
    marker = tmp_path / "ranks.txt"
    argv = ["/bin/sh", "-c", f'echo "$RLSCHED_GANG_RANK $$" >> "$0"; exec {PY} -c "import time; time.sleep(3600)"',
            str(marker)]
    notices: list[dict[str, Any]] = []
    try:
        os.kill(agent_b.pid, signal.SIGSTOP)
        try:
            h = ex.on(a).launch("j-gang", argv, [dev_a, dev_b])
            assert h.unconfirmed
            wait_for(lambda: ex.on(a).find("j-gang") is None, timeout=30, what="the gang to be given up")
            assert not ex.has_unanswered("j-gang")
            assert ex.on(a).recorded_exit("j-gang") == EXIT_NOT_EXECUTABLE
        finally:
            os.kill(agent_b.pid, signal.SIGCONT)
        ranks = wait_for(lambda: (lambda lines: lines if len(lines) == 2 else None)(
            marker.read_text().splitlines() if marker.exists() else []), timeout=60, what="both ranks to start")
        assert sorted(ln.split()[0] for ln in ranks) == ["0", "1"]  # rank 1 did start, late
        wait_for(lambda: notices.extend(ex.notices()) or any(
            n["reason"] == "fenced" and n["node"] == b and n["job"] == "j-gang" for n in notices),
            timeout=60, what="the late rank to be fenced")
        wait_for(lambda: not any(alive(int(ln.split()[1])) for ln in ranks), timeout=60,
                 what="no process of the failed gang to run")
    finally:
        ex.close()


@pytest.mark.parametrize("silence", ["member briefly", "member lost", "leader lost"])
def test_a_gang_whose_node_falls_silent(ray_fleet: RayFleet, tmp_path: Path, silence: str) -> None:
    # A member's node that answers again within lost_after_s keeps its rank: the gang ends done, and the rank
    # is not offered as a stray (the store names only the leader's node). A node silent for longer, the
    # member's or the leader's, loses the gang: EXIT_NODE_LOST (naming a member's node), the ranks that answer
    # fenced at once, the silent one as soon as its node answers. Before, a lost member's gang waited for that
    # rank for ever, and a lost leader's members ran on, unfenced, on GPUs the service had freed. A node
    # that answers again is reported unknown until its stray rank is fenced, so no new work starts beside it.
    from rlsched.runtime.executor import EXIT_NODE_LOST
    from rlsched.runtime.fleet.backend import RayBackend

    a, b = ray_fleet.hosts["a"], ray_fleet.hosts["b"]
    silent, other, rank = (a, b, "0") if silence == "leader lost" else (b, a, "1")
    backend = RayBackend(ray_fleet.address, call_timeout_s=1.0)
    backend.inventory()
    dev_a, dev_b = backend.node(a).gpus[0].uuid, backend.node(b).gpus[0].uuid
    ex = backend.job_executor(tmp_path / "logs")
    ex.lost_after_s = 60.0 if silence == "member briefly" else 2.0
    agent = backend.directory.agent_for(silent)
    assert agent is not None and agent.pid
    marker = tmp_path / "ranks.txt"
    go = tmp_path / "go"  # the ranks end once the test says so (a gang lost first is fenced long before)
    argv = ["/bin/sh", "-c", f'echo "$RLSCHED_GANG_RANK $$" >> "$0"; exec {PY} -c "import os, time\n'
            f'while not os.path.exists({str(go)!r}): time.sleep(0.1)"', str(marker)]
    try:
        h = ex.on(a).launch("j-gang", argv, [dev_a, dev_b])
        assert not h.unconfirmed
        ranks = wait_for(lambda: (lambda lines: lines if len(lines) == 2 else None)(
            marker.read_text().splitlines() if marker.exists() else []), timeout=60, what="both ranks to start")
        pids = {ln.split()[0]: int(ln.split()[1]) for ln in ranks}
        assert ex.poll(h) is None
        ex.strays()  # every agent greeted: from now on only nodes that answer again are listed
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            if silence == "member briefly":
                for _ in range(3):
                    assert ex.poll(h) is None  # b is silent, not lost
            else:
                rc = wait_for(lambda: (lambda x: None if x is None else [x])(ex.poll(h)), timeout=60,
                              what="the gang to be lost with the silent node")[0]
                assert rc == EXIT_NODE_LOST
                assert ex.on(a).lost_node("j-gang") == (None if silence == "leader lost" else b)
                answering = {"0": "1", "1": "0"}[rank]
                wait_for(lambda: not alive(pids[answering]), timeout=30, what="the answering rank to be fenced")
                assert alive(pids[rank])  # its agent is silent: fenced when it answers
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        if silence == "member briefly":
            assert ex.poll(h) is None  # b answers again: it is a returned node, whose jobs strays() lists
            assert alive(pids["1"]) and not [s for s in ex.strays() if s[1] == "j-gang"]
            go.touch()
            rc = wait_for(lambda: (lambda x: None if x is None else [x])(ex.poll(h)), timeout=60,
                          what="the gang to end")[0]
            assert rc == 0
        else:
            # the node answers again, but is reported unknown (no new work) until its stray rank is fenced
            first = backend.inventory()
            assert not any(n.hostname == silent and n.reachable for n in first) or not alive(pids[rank])
            wait_for(lambda: any(n.hostname == silent and n.reachable for n in backend.inventory()), timeout=60,
                     what="the silent node to be reachable again")
            wait_for(lambda: not alive(pids[rank]), timeout=2, what="the stray gone before its node is reachable")
            notices: list[dict[str, Any]] = []
            wait_for(lambda: notices.extend(ex.notices()) or {n["node"] for n in notices
                                                               if n["reason"] == "fenced" and n["job"] == "j-gang"}
                     == {silent, other}, timeout=60, what="both ranks' fences noticed, the silent one once it answers")
            wait_for(lambda: not alive(pids[rank]), timeout=30, what="the silent rank to end")
    finally:
        ex.close()


def test_the_service_settles_a_gang_lost_with_its_member_node_once_naming_that_node(
        ray_fleet: RayFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSCHED_NODE_LOST_AFTER_S", "2")
    marker = tmp_path / "ranks.txt"
    argv = ["/bin/sh", "-c", f'echo "$RLSCHED_GANG_RANK $$" >> "$0"; exec {PY} -c "import time; time.sleep(3600)"',
            str(marker)]
    with service(ray_fleet, tmp_path) as svc:
        job = svc.submit(JobRequest(argv, gpus=8))
        ranks = wait_for(lambda: (lambda lines: lines if len(lines) == 2 else None)(
            marker.read_text().splitlines() if marker.exists() else []), timeout=60, what="both ranks to start")
        pids = {ln.split()[0]: int(ln.split()[1]) for ln in ranks}
        rec = svc.store.get(job.id)
        assert rec.allocation is not None
        member = next(h for h in ray_fleet.hosts.values() if h != rec.allocation.node and h != ray_fleet.hosts["c"])
        agent = svc.backend.directory.agent_for(member)  # type: ignore[attr-defined]
        assert agent is not None and agent.pid
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: finished(svc, job.id), timeout=120, what="the gang to be settled as lost")
            rec = svc.store.get(job.id)
            assert rec.state is JobState.FAILED and rec.reason == f"lost: node {member} lost (stopped answering)"
            assert rec.attempts == 1
            lost = [r for r in svc.store.audit() if r.event is AuditEvent.NODE and r.reason == "node-lost"]
            assert [(r.job, r.extra.get("node")) for r in lost] == [(job.id, member)]
            wait_for(lambda: not alive(pids["0"]), timeout=30, what="the leader to be fenced")
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        wait_for(lambda: not alive(pids["1"]), timeout=60, what="the member to be fenced once its node answers")


def test_a_fence_its_agent_does_not_answer_is_tried_again(
        ray_fleet: RayFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Strays are listed once per agent: a fence lost to a timeout would leave the process running for good.
    from rlsched.runtime.fleet import executor as fleet_executor
    from rlsched.runtime.fleet.backend import RayBackend
    from rlsched.runtime.fleet.directory import AgentUnavailable

    monkeypatch.setattr(fleet_executor, "REFENCE_S", 1.0)
    host = ray_fleet.hosts["c"]
    backend = RayBackend(ray_fleet.address, call_timeout_s=1.0)
    dev = backend.node(host).gpus[0].uuid
    ex = backend.job_executor(tmp_path / "logs")
    agent = backend.directory.agent_for(host)
    assert agent is not None and agent.pid
    notices: list[dict[str, Any]] = []
    try:
        stray = ex.on(host).launch("j-stray", sleeper(STRAY_S), [dev])
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            with pytest.raises(AgentUnavailable):
                ex.fence(host, "j-stray", stray.pid)
            assert alive(stray.pid)
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        wait_for(lambda: not alive(stray.pid), timeout=60, what="the retried fence")
        wait_for(lambda: notices.extend(ex.notices()) or any(
            n["reason"] == "fenced" and n["job"] == "j-stray" and n["pid"] == stray.pid for n in notices),
            what="the fence to be noticed")
    finally:
        ex.close()


def test_a_job_whose_exit_record_its_agent_does_not_answer_is_asked_again_not_requeued(
        ray_fleet: RayFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A service died between launching a job and recording its pid; the job then finished. Its successor
    # finds no process and asks the agent for the recorded exit: if that question times out (a loaded
    # machine), the silence is not "no record" - requeueing would run a finished job twice.
    import sqlite3

    from rlsched.runtime.fleet.directory import AgentDirectory, AgentUnavailable

    spec = ray_fleet.spec(tmp_path / "pool.hcl")
    config = ServiceConfig([spec], tmp_path / "state", backend=f"ray:{ray_fleet.address}", grace_s=1.0, tick_s=0.05)
    first = SchedulerService(config)
    first.start()
    marker = tmp_path / "ran.txt"
    job = first.submit(JobRequest(["/bin/sh", "-c", 'sleep 2; echo ran >> "$0"; echo output of the run',
                                   str(marker)], gpus=1))
    wait_for(lambda: first.store.get(job.id).pid is not None, what="the job to start")
    pid = first.store.get(job.id).pid
    assert pid is not None
    first.close()  # its job runs on under its agent, and ends
    with contextlib.closing(sqlite3.connect(config.state_dir / "jobs.db")) as db, db:
        db.execute("UPDATE jobs SET pid = NULL, pid_start = NULL WHERE id = ?", (job.id,))
    wait_for(lambda: not alive(pid), what="the job to end")
    unanswered = {"left": 3}
    real_call = AgentDirectory.call

    def call(self: AgentDirectory, ref: Any, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        if method == "recorded_exit" and unanswered["left"] > 0:
            unanswered["left"] -= 1
            raise AgentUnavailable(f"agent on {ref.machine} did not answer within 5 s")
        return real_call(self, ref, method, *args, timeout_s=timeout_s)

    monkeypatch.setattr(AgentDirectory, "call", call)
    second = SchedulerService(config)
    second.start()
    try:
        wait_for(lambda: finished(second, job.id), timeout=60, what="the job to be settled")
        rec = second.store.get(job.id)
        assert unanswered["left"] == 0  # the question was asked again after each silence
        assert rec.state is JobState.DONE and rec.attempts == 1, (rec.state, rec.reason)  # its record, not a rerun
        assert marker.read_text().split() == ["ran"]
        # its output, printed while no service ran, is copied home when it is settled
        assert Path(rec.log_path or "").read_text().count("output of the run") == 1
    finally:
        second.close()
