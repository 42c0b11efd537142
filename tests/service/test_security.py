"""Security of the live service against other local users (issue 17 items 1, 2, 3, 5) and client discovery.

Real parts throughout: ``rlsched serve`` and the CLI as subprocesses, a real HTTP
listener standing in for a hostile local user, real file modes under a hostile umask.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlsched.service.auth import MIN_TOKEN_BITS, TokenError, check_token_strength, token_bits
from rlsched.service.statedir import ServiceLock, StateDirBusyError, holder_pid

from .serving import CLI, clean_env, http, start_serve, wait_for, write_workspace


class _Recorder(BaseHTTPRequestHandler):
    """A listener that answers like an rlsched service would, and records every Authorization header."""

    seen: list[str | None] = []
    health: dict[str, object] = {}

    def _answer(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        if self.path.startswith("/healthz"):
            body, code = json.dumps(self.health).encode(), 200
        else:
            body, code = json.dumps({"detail": "missing bearer token"}).encode(), 401
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def recorder(health: dict[str, object]) -> Iterator[tuple[str, list[str | None]]]:
    handler = type("Rec", (_Recorder,), {"seen": [], "health": health})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler.seen
    finally:
        srv.shutdown()
        srv.server_close()


def private_state_dir(path: Path, url: str, pid: int) -> str:
    """A state dir as a service leaves it (0700, token 0600) whose server.json names ``url`` and ``pid``."""
    path.mkdir(parents=True, mode=0o700)
    os.chmod(path, 0o700)
    token = secrets.token_urlsafe(32)
    (path / "token").write_text(token + "\n")
    os.chmod(path / "token", 0o600)
    (path / "server.json").write_text(json.dumps({"pid": pid, "url": url, "state_dir": str(path)}))
    return token


def run_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=clean_env(**env), timeout=120, cwd=cwd)


def test_the_token_never_goes_to_a_listener_that_does_not_own_it(tmp_path: Path) -> None:
    # A process that is alive but does not hold the listening socket: what a stale server.json whose port
    # another user took looks like (or a pid that was reused).
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        sd = tmp_path / ".rlsched-service" / "pool"
        # the listener even forges /healthz: the pid server.json names, and where the token file is
        with recorder({"status": "ok", "version": "x", "state_dir": str(sd), "pid": bystander.pid}) as (url, seen):
            token = private_state_dir(sd, url, bystander.pid)
            from rlsched.service.daemon import find_running

            assert find_running(sd) is None  # so `apply` neither reloads it nor hands it the token
            # 1. the server named, the state dir not: the old client asked /healthz where the token was
            named = run_cli("status", "--server", url, cwd=tmp_path)
            # 2. the state dir named: its server.json points at a port its pid does not hold
            stale = run_cli("status", "--state-dir", str(sd), cwd=tmp_path)
            # 3. discovered from the current directory (the same stale server.json)
            found = run_cli("status", cwd=tmp_path)
            assert all(h is None for h in seen), seen
            assert not any(token in (h or "") for h in seen)
            assert len(seen) >= 3, seen
        for p in (named, stale, found):
            assert p.returncode == 1, p.stderr
            assert len(p.stderr.strip().splitlines()) == 1 and "needs a token" in p.stderr, p.stderr
        assert "is not sent to" in stale.stderr and "is not sent to" in found.stderr
    finally:
        bystander.kill()
        bystander.wait(10)


def test_healthz_does_not_reveal_the_state_dir_and_discovery_finds_the_service(tmp_path: Path) -> None:
    # #22.4: serve --listen 127.0.0.1:0 with the default state dir; a client in the spec's directory finds it
    spec, fleet = write_workspace(tmp_path)
    sd = tmp_path / ".rlsched-service" / "pool"
    s = start_serve(spec, fleet, sd, default_state_dir=True)
    try:
        status, _, body = http("GET", s.url + "/healthz")
        assert status == 200 and "state_dir" not in json.loads(body)
        assert str(sd) not in body.decode() and str(tmp_path) not in body.decode()
        sub = run_cli("submit", "--gpus", "1", "--", sys.executable, "-c", "print('hi')", cwd=tmp_path)
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.strip()
        wait_for(lambda: json.loads(run_cli("status", job, "--json", cwd=tmp_path).stdout)["state"] == "done",
                 timeout=120, what="the job to finish")
        # elsewhere nothing is found, and the message says what was tried
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        lost = run_cli("status", cwd=elsewhere, RLSCHED_SERVER="")
        assert lost.returncode == 1 and len(lost.stderr.strip().splitlines()) == 1
        assert "no rlsched service at http://127.0.0.1:8470" in lost.stderr or "needs a token" in lost.stderr
        if "no rlsched service" in lost.stderr:
            assert f"no running service's server.json under {elsewhere}/.rlsched-service/*/" in lost.stderr
    finally:
        assert s.stop() == 0


def test_state_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path)
    s = start_serve(spec, fleet, tmp_path / "state", umask=0)
    try:
        status, _, raw = http("POST", s.url + "/v1/jobs", token=s.token,
                              body={"argv": [sys.executable, "-c", "print('secret output')"], "gpus": 1})
        assert status == 201, raw
        job = json.loads(raw)["id"]

        def done() -> bool:
            _, _, body = http("GET", f"{s.url}/v1/jobs/{job}", token=s.token)
            return bool(json.loads(body)["state"] == "done")

        wait_for(done, timeout=120, what="the job to finish")
        sd = s.state_dir
        assert stat.S_IMODE(sd.stat().st_mode) == 0o700
        assert stat.S_IMODE((sd / "logs").stat().st_mode) == 0o700
        files = [sd / n for n in ("jobs.db", "jobs.db-wal", "jobs.db-shm", "token", "server.json", "service.lock")]
        files += sorted((sd / "logs").iterdir())
        assert any(f.name == f"{job}.log" for f in files)
        modes = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files if f.exists()}
        assert {"jobs.db", "jobs.db-wal", "jobs.db-shm"} <= set(modes)
        assert set(modes.values()) == {"0o600"}, modes
    finally:
        assert s.stop() == 0


def test_job_logs_and_exit_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    from rlsched.runtime.executor import LocalExecutor

    old = os.umask(0)
    try:
        ex = LocalExecutor(tmp_path / "logs")
        h = ex.launch("j-1", [sys.executable, "-c", "print('x')"], [])
        assert ex.wait(h, 120) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "logs").stat().st_mode) == 0o700
    assert {oct(stat.S_IMODE(f.stat().st_mode)) for f in (h.log_path, h.exit_file)} == {"0o600"}


def test_an_existing_state_dir_is_tightened(tmp_path: Path) -> None:
    from rlsched.runtime.store import Store

    sd = tmp_path / "state"
    sd.mkdir(mode=0o755)
    os.chmod(sd, 0o755)
    db = sd / "jobs.db"
    Store(db).close()
    for f in sd.iterdir():
        os.chmod(f, 0o644)
    from rlsched.service.statedir import secure_dir

    secure_dir(sd)
    Store(db).close()
    assert stat.S_IMODE(sd.stat().st_mode) == 0o700
    assert {oct(stat.S_IMODE(f.stat().st_mode)) for f in sd.iterdir()} == {"0o600"}


@pytest.mark.parametrize("weak", ["abcdefghi", "a" * 64, "password" * 8, "0123456789abcdef" * 4])
def test_a_weak_preseeded_token_is_refused(tmp_path: Path, weak: str) -> None:
    spec, fleet = write_workspace(tmp_path)
    sd = tmp_path / "state"
    sd.mkdir()
    (sd / "token").write_text(weak + "\n")
    os.chmod(sd / "token", 0o600)
    p = subprocess.run([*CLI, "serve", str(spec), "--backend", f"sim:{fleet}", "--state-dir", str(sd), "--listen",
                        "127.0.0.1:0"], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "too weak" in lines[0], p.stderr
    assert "at least 256" in lines[0] and "Traceback" not in p.stderr
    assert not (sd / "server.json").exists()


def test_token_entropy_estimate() -> None:
    for _ in range(500):  # every token the service or the usual tools would make passes
        for tok in (secrets.token_urlsafe(32), secrets.token_hex(32), secrets.token_hex(32).upper()):
            assert token_bits(tok) >= MIN_TOKEN_BITS, tok
            check_token_strength(tok, "t")
    for weak in ("", "abcdefghi", "x" * 200, "ab" * 100, secrets.token_hex(16), secrets.token_urlsafe(24)):
        assert token_bits(weak) < MIN_TOKEN_BITS, weak
        with pytest.raises(TokenError, match="too weak"):
            check_token_strength(weak, "t")


def test_the_state_dir_lock_names_its_holder(tmp_path: Path) -> None:
    holder = ServiceLock(tmp_path / "sd").acquire()
    try:
        assert holder_pid(tmp_path / "sd") == os.getpid()
        with pytest.raises(StateDirBusyError, match=f"in use by another rlsched service \\(pid {os.getpid()}\\)"):
            ServiceLock(tmp_path / "sd").acquire()
    finally:
        holder.release()
    assert holder_pid(tmp_path / "sd") is None
    with ServiceLock(tmp_path / "sd"):  # free again
        pass


def test_two_services_started_together_on_one_state_dir(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path)
    sd = tmp_path / "state"
    argv = [*CLI, "serve", str(spec), "--backend", f"sim:{fleet}", "--state-dir", str(sd), "--listen",
            "127.0.0.1:0"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                              start_new_session=True) for _ in range(2)]
    try:
        # exactly one of them fails, at once, naming the other
        loser = wait_for(lambda: next((p for p in procs if p.poll() is not None), None), timeout=120,
                         what="one of the two services to give up")
        winner = next(p for p in procs if p is not loser)
        err = loser.communicate(timeout=120)[1]
        assert loser.returncode == 1, err
        assert f"is in use by another rlsched service (pid {winner.pid}" in err, err
        assert len(err.strip().splitlines()) == 1
        wait_for(lambda: (sd / "server.json").exists() and json.loads((sd / "server.json").read_text())["pid"]
                 == winner.pid, timeout=120, what="the winner to serve")
        assert winner.poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
            p.communicate(timeout=60)
