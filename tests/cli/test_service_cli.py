"""``rlsched serve | submit | status | cancel | logs | audit`` and ``apply``'s service start, as subprocesses.

Covers the issue's fault cases through the real CLI: ``kill -9`` of the service
while jobs run, then a restart - every job runs to completion exactly once and
nothing is lost from the queue or the audit trail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from service.serving import CLI, Served, clean_env, http, start_serve, wait_for, write_workspace


def states(s: Served, jobs: list[str]) -> dict[str, str]:
    status, _, raw = http("GET", s.url + "/v1/jobs", token=s.token)
    assert status == 200, raw
    return {j["id"]: j["state"] for j in json.loads(raw) if j["id"] in jobs}


def no_traceback(p: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr


def test_submit_status_logs_audit_cancel(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path)
    s = start_serve(spec, fleet, tmp_path / "state")
    try:
        sub = s.cli("submit", "--gpus", "1", "--priority", "2", "--user", "bob", "--estimate", "5m", "--",
                    sys.executable, "-c", "import sys; print('out line'); print('err line', file=sys.stderr)")
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.strip()
        assert sub.stdout == job + "\n" and job.startswith("j-")  # only the id on stdout: $(rlsched submit ...) works
        wait_for(lambda: states(s, [job]).get(job) == "done", what="the job to finish")
        one = s.cli("status", job)
        assert one.returncode == 0, one.stderr
        assert re.search(r"^state\s+done$", one.stdout, re.M) and re.search(r"^exit code\s+0$", one.stdout, re.M)
        assert re.search(r"^allocation\s+gpu-h100-01: GPU-", one.stdout, re.M), one.stdout
        as_json = json.loads(s.cli("status", job, "--json").stdout)
        assert as_json["id"] == job and as_json["state"] == "done" and as_json["request"]["argv"][0] == sys.executable
        table = s.cli("status")
        assert table.returncode == 0 and job in table.stdout and "done" in table.stdout
        logs = s.cli("logs", job)
        assert logs.returncode == 0 and "out line" in logs.stdout and "err line" in logs.stdout
        follow = s.cli("logs", job, "--follow", timeout=120)  # a finished job: prints everything and returns
        assert follow.returncode == 0 and "out line" in follow.stdout
        audit = s.cli("audit", "--json", "--job", job)
        assert audit.returncode == 0, audit.stderr
        events = [r["event"] for r in json.loads(audit.stdout)]
        assert events[0] == "submission" and "allocation" in events and events[-1] == "completion"
        recent = s.cli("audit", "--since", "10m")
        assert recent.returncode == 0 and "submission" in recent.stdout and job in recent.stdout
        after = s.cli("audit", "--json", "--since", str(json.loads(audit.stdout)[-1]["id"]), "--job", job)
        assert json.loads(after.stdout) == []

        # a queued job waits (all 4 GPUs are busy); status says why and where it is in the queue
        blockers = [s.cli("submit", "--gpus", "2", "--", "sleep", "60").stdout.strip() for _ in range(2)]
        waiting = s.cli("submit", "--gpus", "1", "--deadline", "+2h", "--", "sleep", "60").stdout.strip()
        wait_for(lambda: set(states(s, blockers).values()) == {"running"}, what="the blockers to run")
        view = json.loads(s.cli("status", waiting, "--json").stdout)
        assert view["state"] == "queued" and view["position"] == 1 and view["reason"], view
        text = s.cli("status", waiting).stdout
        assert "position" in text and "reason" in text
        cancel = s.cli("cancel", waiting, *blockers)
        assert cancel.returncode == 0, cancel.stderr
        assert f"{waiting}: cancelled" in cancel.stdout
        wait_for(lambda: set(states(s, [*blockers, waiting]).values()) == {"cancelled"}, what="the cancels")
    finally:
        assert s.stop() == 0
    assert "Traceback" not in s.log_text(), s.log_text()[-5000:]


def test_client_errors_are_one_line(tmp_path: Path) -> None:
    env = clean_env(RLSCHED_SERVER="http://127.0.0.1:9")  # nothing listens on the discard port
    p = subprocess.run([*CLI, "submit", "--gpus", "1", "--", "true"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip() == ("error: no rlsched service at http://127.0.0.1:9 ($RLSCHED_SERVER); start one "
                                "with `rlsched serve POOL.hcl` from this directory, or name it with --state-dir DIR "
                                "or --server URL")
    spec, fleet = write_workspace(tmp_path)
    s = start_serve(spec, fleet, tmp_path / "state")
    try:
        bad_token = s.cli("status", RLSCHED_TOKEN="wrong")
        assert bad_token.returncode == 1 and len(bad_token.stderr.strip().splitlines()) == 1
        assert "refused the token" in bad_token.stderr
        # a server named without its state dir gets no token (nobody is asked where a token file is)
        no_token = subprocess.run([*CLI, "status", "--server", s.url], capture_output=True, text=True,
                                  env=clean_env(), timeout=60, cwd="/")
        assert no_token.returncode == 1 and "needs a token: set RLSCHED_TOKEN or pass --state-dir" in no_token.stderr
        named = subprocess.run([*CLI, "status", "--state-dir", str(s.state_dir)], capture_output=True, text=True,
                               env=clean_env(), timeout=60, cwd="/")
        assert named.returncode == 0, named.stderr  # the state dir's server.json and token file
        for args, words in [
            (("submit", "--mig", "9g.1gb", "--", "true"), "unknown MIG profile '9g.1gb'"),
            (("submit", "--user", "a b", "--", "true"), "user:"),
            (("submit", "--gpus", "3", "--user", "intern", "--pool", "train", "--", "true"), "quota"),
            (("submit", "--gpus", "1", "--mig", "1g.10gb", "--", "true"), "either --gpus or --mig"),
            (("submit", "--deadline", "tomorrowish", "--", "true"), "--deadline 'tomorrowish'"),
            (("status", "j-nope"), "j-nope"),
            (("cancel", "j-nope"), "j-nope"),
            (("logs", "j-nope"), "j-nope"),
            (("audit", "--since", "yesterday"), "--since 'yesterday'"),
        ]:
            p = s.cli(*args)
            assert p.returncode == 1, (args, p.stdout, p.stderr)
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (args, p.stderr)
            no_traceback(p)
        usage = s.cli("submit", "--gpus", "0", "--", "true")
        assert usage.returncode == 2 and "--gpus" in usage.stderr
        # serve refuses a second service on the same state dir, and a port in use, in one line
        again = subprocess.run([*CLI, "serve", str(spec), "--backend", f"sim:{fleet}", "--state-dir",
                                str(s.state_dir), "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                               env=clean_env(), timeout=60)
        assert again.returncode == 1, again.stderr
        assert f"is in use by another rlsched service (pid {s.proc.pid}, {s.url})" in again.stderr, again.stderr
        assert len(again.stderr.strip().splitlines()) == 1, again.stderr
        port = s.url.rsplit(":", 1)[1]
        busy = subprocess.run([*CLI, "serve", str(spec), "--backend", f"sim:{fleet}", "--state-dir",
                               str(tmp_path / "other"), "--listen", f"127.0.0.1:{port}"], capture_output=True,
                              text=True, env=clean_env(), timeout=60)
        assert busy.returncode == 1 and "cannot listen on 127.0.0.1:" in busy.stderr, busy.stderr
        no_traceback(busy)
    finally:
        assert s.stop() == 0


JOB = ("import os, sys, time\n"
       "tag, out = sys.argv[1], sys.argv[2]\n"
       "def note(what):\n"
       "    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\n"
       "    os.write(fd, f'{what} {tag}\\n'.encode()); os.close(fd)\n"
       "note('start'); time.sleep(float(sys.argv[3])); note('end')\n")


@pytest.mark.slow
def test_kill_9_then_restart_runs_every_job_exactly_once(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path)
    out = tmp_path / "ran.txt"
    state = tmp_path / "state"
    s = start_serve(spec, fleet, state)
    tags = [f"t{i:02d}" for i in range(14)]
    jobs = {}
    for i, tag in enumerate(tags):  # over HTTP: 14 CLI start-ups would outlast the first jobs
        status, _, raw = http("POST", s.url + "/v1/jobs", token=s.token, body={
            "argv": [sys.executable, "-c", JOB, tag, str(out), "3" if i < 6 else "0.3"], "gpus": 1 if i % 3 else 2})
        assert status == 201, raw
        jobs[json.loads(raw)["id"]] = tag
    wait_for(lambda: "running" in states(s, list(jobs)).values(), what="some job to run")
    before = states(s, list(jobs))
    assert "running" in before.values(), before  # (queued ones too, unless a slow machine let them all start)
    os.kill(s.proc.pid, signal.SIGKILL)  # no cleanup at all: server.json stays, jobs keep running
    s.proc.wait(10)
    assert (state / "server.json").exists()
    time.sleep(1.0)  # let some running jobs finish while no service watches them
    s2 = start_serve(spec, fleet, state, log_name="serve2.log")
    try:
        _, _, raw = http("GET", s2.url + "/v1/info", token=s2.token)
        recovered = json.loads(raw)["recovered"]
        assert recovered["adopted"] + recovered["finished"] >= 1, recovered  # running jobs were picked up, not rerun
        wait_for(lambda: set(states(s2, list(jobs)).values()) == {"done"}, timeout=120,
                 what="every job to finish after the restart")
        lines = out.read_text().splitlines()
        for tag in tags:
            assert lines.count(f"start {tag}") == 1, (tag, lines)
            assert lines.count(f"end {tag}") == 1, (tag, lines)
        assert len(lines) == 2 * len(tags)
        _status, _, raw = http("GET", s2.url + "/v1/audit?limit=100000", token=s2.token)
        trail = json.loads(raw)
        ids = [r["id"] for r in trail]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        for job in jobs:
            mine = [r["event"] for r in trail if r["job"] == job]
            assert mine.count("submission") == 1 and mine.count("completion") == 1, (job, mine)
        # the token survived the restart
        assert s.token == s2.token
    finally:
        assert s2.stop() == 0
    from rlsched.runtime.store import Store

    with Store(state / "jobs.db") as store:
        assert store.check_invariants() == []
        assert {r.id for r in store.jobs()} == set(jobs)


@pytest.mark.slow
def test_apply_starts_the_service_then_hot_swaps_it(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path)
    state = tmp_path / "svc"
    env = clean_env(RLSCHED_BACKEND=f"sim:{fleet}")
    args = ["apply", str(spec), "--auto-approve", "--service-state-dir", str(state), "--service-listen",
            "127.0.0.1:0"]
    first = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "Scheduler service started at http://127.0.0.1:" in first.stdout
    info = json.loads((state / "server.json").read_text())
    s = Served(subprocess.Popen(["true"]), info["url"], state, spec, fleet, state / "service.log")
    try:
        running = s.cli("submit", "--gpus", "4", "--", "sleep", "60").stdout.strip()
        queued = s.cli("submit", "--gpus", "4", "--", "sleep", "60").stdout.strip()
        wait_for(lambda: states(s, [running]).get(running) == "running", what="the first job to run")
        pid_before = json.loads(s.cli("status", running, "--json").stdout).get("pid")
        spec.write_text(spec.read_text().replace('scheduler = "fifo"', 'scheduler = "sjf"'))
        second = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        assert second.returncode == 0, second.stderr + second.stdout
        assert f"Scheduler service at {info['url']} reloaded" in second.stdout, second.stdout
        assert json.loads((state / "server.json").read_text())["pid"] == info["pid"]  # same process
        status, _, raw = http("GET", s.url + "/v1/info", token=s.token)
        assert status == 200 and "sjf" in raw.decode(), raw
        after = states(s, [running, queued])
        assert after == {running: "running", queued: "queued"}, after
        assert json.loads(s.cli("status", running, "--json").stdout).get("pid") == pid_before
        skipped = subprocess.run([*CLI, *args, "--no-serve"], capture_output=True, text=True, env=env, timeout=120,
                                 cwd=tmp_path)
        assert skipped.returncode == 0 and "Scheduler service" not in skipped.stdout
        assert s.cli("cancel", running, queued).returncode == 0
        wait_for(lambda: set(states(s, [running, queued]).values()) == {"cancelled"}, what="the cancels")
    finally:
        os.kill(info["pid"], signal.SIGTERM)
        wait_for(lambda: not (state / "server.json").exists(), timeout=120, what="the service to stop")


def test_stop_stops_the_service_found_from_the_spec_directory(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path)
    sd = tmp_path / ".rlsched-service" / "pool"
    s = start_serve(spec, fleet, sd, default_state_dir=True)
    try:
        job = s.cli("submit", "--gpus", "1", "--", "sleep", "3600").stdout.strip()
        wait_for(lambda: states(s, [job]).get(job) == "running", what="the job to run")
        job_pid = json.loads(s.cli("status", job, "--json").stdout)["pid"]
        p = subprocess.run([*CLI, "stop"], capture_output=True, text=True, env=clean_env(), timeout=180, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert f"stopped the rlsched service at {s.url} (pid {s.proc.pid}" in p.stderr, p.stderr
        assert s.proc.wait(120) == 0
        assert not (sd / "server.json").exists()
        os.kill(job_pid, 0)  # the job outlives the service
        again = subprocess.run([*CLI, "stop", str(spec)], capture_output=True, text=True, env=clean_env(),
                               timeout=180, cwd=tmp_path)
        assert again.returncode == 0 and "no rlsched service runs for state dir" in again.stderr, again.stderr
        lost = subprocess.run([*CLI, "stop"], capture_output=True, text=True, env=clean_env(), timeout=180,
                              cwd=tmp_path / ".rlsched-service")
        assert lost.returncode == 1 and "no rlsched service runs from this directory" in lost.stderr, lost.stderr
    finally:
        s.stop()
        with contextlib.suppress(Exception):
            os.killpg(job_pid, signal.SIGKILL)
