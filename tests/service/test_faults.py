"""Faults while ``rlsched serve`` runs, through the real CLI and HTTP API: the service keeps scheduling.

Each test starts ``python -m rlsched serve`` as a subprocess on a simulated fleet
(:mod:`tests.service.serving`) and drives it with ``python -m rlsched submit |
status | logs | audit`` and plain HTTP:

* a corrupted model folder: the service starts on the fallback heuristic, says
  why (audit, ``/v1/info``, ``/metrics``) and runs jobs;
* an MLflow registry that cannot be reached (``models:/`` URI, closed port): same;
* a real ``mlflow server`` killed while the service serves a model from it: the
  loaded model keeps deciding, and a reload keeps it rather than fall back (slow: ~20 s);
* an NVML health event (Xid 79) on one GPU: its job is requeued elsewhere, the GPU
  gets no more work, the rest of the fleet keeps scheduling;
* job processes that crash (SIGABRT, SIGSEGV): failed with the signal recorded,
  their logs readable, the next job runs normally.

Every service (and every job process it left running) is stopped by a fixture
finalizer, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .serving import Served, http, start_serve, wait_for, write_workspace

PY = sys.executable
#: A job that ends on its own within a few seconds.
QUICK = [PY, "-c", "print('quick job ran', flush=True)"]
#: A job that runs until cancelled (cancelled by the test, killed by the finalizer otherwise).
LONG = [PY, "-c", "import time; time.sleep(3600)"]


def _kill_jobs(state_dir: Path) -> None:
    """SIGKILL the process group of every job the store shows holding GPUs (they outlive the service)."""
    from rlsched.runtime.executor import proc_start_time
    from rlsched.runtime.store import Store

    db = state_dir / "jobs.db"
    if not db.exists():
        return
    with contextlib.suppress(Exception), Store(db) as store:
        for rec in store.holding():
            if rec.pid and proc_start_time(rec.pid) == rec.pid_start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(rec.pid, signal.SIGKILL)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Factory: ``serve(spec, fleet)`` starts ``rlsched serve``; all are stopped (and their jobs killed) after."""
    started: list[Served] = []
    state_dirs: list[Path] = []

    def start(spec: Path, fleet: Path, *extra: str, state: str = "state") -> Served:
        state_dir = tmp_path / state
        state_dirs.append(state_dir)
        s = start_serve(spec, fleet, state_dir, "--tick-ms", "30", *extra)
        started.append(s)
        return s

    yield start
    errors = []
    for s in started:
        try:
            s.stop()
        except AssertionError as exc:  # pragma: no cover - reported after the cleanup
            errors.append(str(exc))
    for d in state_dirs:
        _kill_jobs(d)
    assert not errors, errors


def get(s: Served, path: str) -> Any:
    status, _, raw = http("GET", s.url + path, token=s.token)
    assert status == 200, (path, status, raw)
    return json.loads(raw)


def metrics(s: Served) -> str:
    status, _, raw = http("GET", s.url + "/metrics", token=s.token)
    assert status == 200, raw
    return raw.decode()


def submit(s: Served, argv: list[str], *opts: str) -> str:
    """``rlsched submit [opts] -- argv``; the job id."""
    p = s.cli("submit", *opts, "--", *argv)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def submit_http(s: Served, argv: list[str], **body: Any) -> str:
    status, _, raw = http("POST", s.url + "/v1/jobs", token=s.token, body={"argv": argv, **body})
    assert status == 201, raw
    return str(json.loads(raw)["id"])


def job(s: Served, job_id: str) -> dict[str, Any]:
    return dict(get(s, f"/v1/jobs/{job_id}"))


def state_of(s: Served, job_id: str) -> str:
    return str(job(s, job_id)["state"])


def wait_state(s: Served, job_id: str, *want: str, timeout: float = 120) -> dict[str, Any]:
    try:
        wait_for(lambda: state_of(s, job_id) in want, timeout=timeout, what=f"{job_id} to be {'/'.join(want)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {job(s, job_id)}\n{s.log_text()[-3000:]}") from None
    return job(s, job_id)


def alive(s: Served) -> None:
    assert s.proc.poll() is None, s.log_text()[-3000:]
    status, _, _ = http("GET", s.url + "/healthz")
    assert status == 200
    assert get(s, "/v1/info")["loop_running"]


def with_model(spec: Path, model: str) -> None:
    """Point the spec's policy block at ``model`` (the RL scheduler, fifo fallback)."""
    text = spec.read_text()
    assert 'scheduler = "rl"' in text
    spec.write_text(text.replace('scheduler = "rl"', f'scheduler = "rl"\n  model     = "{model}"'))


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_fallback_serving(s: Served, detail_words: str) -> None:
    """The service serves the fallback because the model did not load, and says so everywhere."""
    info = get(s, "/v1/info")
    assert info["scheduler"] == "rl" and info["fallback"] == "fifo", info
    assert info["primary_available"] is False, info
    # jobs submitted through the CLI run to completion on the heuristic
    jobs = [submit(s, QUICK, "--gpus", "1"), submit(s, QUICK, "--gpus", "2")]
    for j in jobs:
        assert wait_state(s, j, "done", "failed")["state"] == "done"
        allocs = [r for r in json.loads(s.cli("audit", "--json", "--job", j).stdout) if r["event"] == "allocation"]
        assert allocs and allocs[0]["policy"] == "fifo", allocs
    logs = s.cli("logs", jobs[0])
    assert logs.returncode == 0 and "quick job ran" in logs.stdout, logs.stdout + logs.stderr
    audit = s.cli("audit", "--json")
    assert audit.returncode == 0, audit.stderr
    fallbacks = [r for r in json.loads(audit.stdout) if r["event"] == "fallback"]
    assert fallbacks, audit.stdout
    assert fallbacks[0]["reason"] == "model-missing" and fallbacks[0]["extra"]["stage"] == "load", fallbacks[0]
    assert detail_words in fallbacks[0]["extra"]["detail"], fallbacks[0]
    text = s.cli("audit").stdout  # the table says it too
    assert "fallback" in text and "model-missing" in text, text
    info = get(s, "/v1/info")
    assert info["fallbacks_by_reason"].get("model-missing", 0) >= 1, info
    assert 'rlsched_fallbacks_total{reason="model-missing"}' in metrics(s)
    alive(s)


def test_corrupted_model_file_serves_the_fallback(tmp_path: Path, serve: Callable[..., Served]) -> None:
    model = tmp_path / "bad-model"
    model.mkdir()
    # a valid codec, but weights that are not a torch file (a truncated or overwritten policy.pt)
    (model / "codec.json").write_text(json.dumps({"signature": "x" * 16, "window": 4, "max_pools": 2, "layouts": 1}))
    (model / "policy.pt").write_bytes(b"\x00garbage, not a torch checkpoint\xff" * 20)
    spec, fleet = write_workspace(tmp_path, scheduler="rl")
    with_model(spec, str(model))
    s = serve(spec, fleet)
    assert_fallback_serving(s, "policy.pt")
    assert get(s, "/v1/info")["model"] == str(model)


def test_mlflow_registry_unreachable_at_start_serves_the_fallback(tmp_path: Path, serve: Callable[..., Served],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    # the service inherits this environment (serving.clean_env copies os.environ)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("RLSCHED_MODEL_CACHE", str(tmp_path / "model-cache"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)  # the service's own defaults: no retries, short timeout
    spec, fleet = write_workspace(tmp_path, scheduler="rl")
    with_model(spec, "models:/rlsched-ppo@champion")
    s = serve(spec, fleet, state="state-mlflow")
    assert get(s, "/v1/info")["model"] == "models:/rlsched-ppo@champion"
    assert_fallback_serving(s, "not reachable")


QUIET_MLFLOW = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """(url, process) of a real ``mlflow server`` of this test only (the test kills it; the finalizer too)."""
    pytest.importorskip("mlflow")
    pytest.importorskip("torch")
    exe = shutil.which("mlflow")
    root = tmp_path / "mlflow-server"
    root.mkdir()
    url = f"http://127.0.0.1:{closed_port()}"
    with (root / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [*([exe] if exe else [PY, "-m", "mlflow"]), "server", "--backend-store-uri",
             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
             "--serve-artifacts", "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **QUIET_MLFLOW}, start_new_session=True,
            cwd=root)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return proc.poll() is not None  # stop waiting: reported below

    try:
        wait_for(healthy, timeout=90, interval=0.25, what="mlflow server")
        assert proc.poll() is None, (root / "server.log").read_text(errors="replace")[-3000:]
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.slow
def test_mlflow_registry_going_away_while_serving(tmp_path: Path, serve: Callable[..., Served],
                                                  mlflow_server: tuple[str, subprocess.Popen[bytes]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    url, server = mlflow_server
    for k, v in {**QUIET_MLFLOW, "MLFLOW_TRACKING_URI": url, "RLSCHED_MODEL_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT", "RLSCHED_AUDIT_FILE"):
        monkeypatch.delenv(var, raising=False)  # also undoes what the registry code sets in this process
    monkeypatch.chdir(tmp_path)
    # a smoke model (random weights) registered as models:/NAME@challenger
    import torch

    from rlsched.envs.codec import ObservationCodec
    from rlsched.learned.ppo import PolicyModel
    from rlsched.learned.ppo_net import SlotScorer
    from rlsched.train.registry import register_policy

    codec = ObservationCodec()
    net = SlotScorer(codec.observation_space)
    with torch.no_grad():  # constant scores: place whenever a placement is legal (random weights may only wait)
        for head, bias in ((net.place_head, 10.0), (net.wait_head, -10.0), (net.reconf_head, -10.0),
                           (net.scale_head, -10.0)):
            last = [m for m in head.modules() if isinstance(m, torch.nn.Linear)][-1]
            last.weight.zero_()
            last.bias.fill_(bias)
    folder = PolicyModel.save(tmp_path / "smoke", net, codec, {"name": "smoke"})
    name = f"faults-{uuid.uuid4().hex[:8]}"
    register_policy(folder, name=name)
    spec, fleet = write_workspace(tmp_path, scheduler="rl")
    with_model(spec, f"models:/{name}@challenger")
    s = serve(spec, fleet, state="state-registry")
    info = get(s, "/v1/info")
    assert info["primary_available"] is True and info["model_version"], info
    first = submit(s, QUICK, "--gpus", "1")
    assert wait_state(s, first, "done", "failed")["state"] == "done"
    allocs = [r for r in json.loads(s.cli("audit", "--json", "--job", first).stdout) if r["event"] == "allocation"]
    assert allocs and allocs[0]["policy"] != "fifo", allocs  # the registered model placed it

    os.killpg(server.pid, signal.SIGKILL)  # the registry goes away
    server.wait(10)
    # the loaded model keeps serving; a reload that cannot reach the registry keeps it, never crashes
    during = submit(s, QUICK, "--gpus", "2")
    assert wait_state(s, during, "done", "failed")["state"] == "done"
    allocs = [r for r in json.loads(s.cli("audit", "--json", "--job", during).stdout) if r["event"] == "allocation"]
    assert allocs and allocs[0]["policy"] != "fifo", allocs  # still the model: it is in memory
    version = info["model_version"]
    status, _, raw = http("POST", s.url + "/v1/reload", token=s.token)
    assert status == 200, raw
    reloaded = json.loads(raw)
    assert "still serving the previous model" in reloaded["warning"], reloaded
    after = [submit(s, QUICK, "--gpus", "1"), submit_http(s, QUICK, gpus=4)]
    for j in after:
        assert wait_state(s, j, "done", "failed")["state"] == "done"
        allocs = [r for r in json.loads(s.cli("audit", "--json", "--job", j).stdout) if r["event"] == "allocation"]
        assert allocs and allocs[0]["policy"] != "fifo", allocs  # the working model was kept
    info = get(s, "/v1/info")
    assert info["primary_available"] is True and info["model_version"] == version, info
    trail = json.loads(s.cli("audit", "--json").stdout)
    fallbacks = [r for r in trail if r["event"] == "fallback"]
    assert fallbacks and "not reachable" in fallbacks[-1]["extra"]["detail"], fallbacks  # the failed load
    switch = [r for r in trail if r["event"] == "policy-switch" and r["reason"] == "reload"][-1]
    assert switch["extra"]["kept_model"] and switch["extra"]["not_loaded"].startswith("models:/"), switch
    alive(s)


def _gpu_host(fleet: Path, uuid: str) -> str:
    from rlsched.runtime.sim_backend import read_fleet

    for n in read_fleet(fleet)["nodes"]:
        if any(g["uuid"] == uuid for g in n["gpus"]):
            return str(n["hostname"])
    raise AssertionError(f"{uuid} not in {fleet}")


def test_xid_on_one_gpu_closes_it_and_scheduling_goes_on(tmp_path: Path, serve: Callable[..., Served]) -> None:
    from rlsched.runtime.sim_backend import SimulatedBackend

    spec, fleet = write_workspace(tmp_path)  # 4 whole H100s in pool "train"
    s = serve(spec, fleet, "--grace", "1")
    victim = submit(s, LONG, "--gpus", "1")
    (bad,) = wait_state(s, victim, "running")["allocation"]["devices"]
    assert bad.startswith("GPU-")
    # NVML reports a critical Xid on that GPU (as the NVML event loop would)
    SimulatedBackend(fleet).inject_xid(_gpu_host(fleet, bad), bad, 79)
    wait_for(lambda: job(s, victim)["attempts"] == 2 and state_of(s, victim) == "running", timeout=120,
             what="the job on the failed GPU to be requeued and restarted")
    moved = job(s, victim)["allocation"]["devices"]
    assert bad not in moved, moved
    info = get(s, "/v1/info")
    assert list(info["unhealthy_gpus"]) == [bad] and "Xid 79" in info["unhealthy_gpus"][bad], info
    assert "rlsched_unhealthy_gpus 1.0" in metrics(s)
    trail = json.loads(s.cli("audit", "--json", "--job", victim).stdout)
    pre = [r for r in trail if r["event"] == "preemption"]
    assert pre and "unhealthy" in pre[0]["reason"] and bad in pre[0]["gpus"], trail

    # keep scheduling on the three healthy GPUs: two more long jobs fill them, a short one waits, then runs
    fillers = [submit(s, LONG, "--gpus", "1") for _ in range(2)]
    for f in fillers:
        assert bad not in wait_state(s, f, "running")["allocation"]["devices"]
    waiting = submit(s, QUICK, "--gpus", "1", "--pool", "train")
    wait_for(lambda: "unhealthy" in (job(s, waiting).get("reason") or "").lower(), timeout=120,
             what="the queued job to say a GPU is unhealthy")
    assert state_of(s, waiting) == "queued"
    listing = json.loads(s.cli("status", "--json").stdout)
    holding = [j for j in listing if j["state"] in ("running", "preempted")]
    assert len(holding) == 3 and all(bad not in (j.get("allocation") or {}).get("devices", []) for j in holding)
    cancel = s.cli("cancel", fillers[0])
    assert cancel.returncode == 0, cancel.stderr
    done = wait_state(s, waiting, "done", "failed")
    assert done["state"] == "done" and bad not in done["allocation"]["devices"], done
    assert s.cli("cancel", victim, fillers[1]).returncode == 0
    for j in (victim, *fillers):
        wait_state(s, j, "cancelled")
    alive(s)
    assert get(s, "/v1/info")["unhealthy_gpus"] == {bad: info["unhealthy_gpus"][bad]}


CRASHERS = {
    # no core file: the rlimit is set in the job itself
    "abort": ("import os, resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
              "print('about to abort', flush=True); os.abort()", "SIGABRT", -signal.SIGABRT),
    "segfault": ("import ctypes, resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
                 "print('about to segfault', flush=True); ctypes.string_at(0)", "SIGSEGV", -signal.SIGSEGV),
    "exit": ("import sys; print('about to exit 3', flush=True); sys.exit(3)", "exit status 3", 3),
}


def test_crashing_jobs_fail_and_the_next_job_runs(tmp_path: Path, serve: Callable[..., Served]) -> None:
    spec, fleet = write_workspace(tmp_path)
    s = serve(spec, fleet)
    crashed = {name: submit(s, [PY, "-c", code], "--gpus", "1") for name, (code, _, _) in CRASHERS.items()}
    for name, j in crashed.items():
        _, why, code = CRASHERS[name]
        view = wait_state(s, j, "done", "failed", "cancelled")
        assert view["state"] == "failed" and view["exit_code"] == code, (name, view)
        assert why in (view.get("reason") or view.get("last_reason") or ""), (name, view)
        one = s.cli("status", j)
        assert one.returncode == 0, one.stderr
        assert re.search(r"^state\s+failed$", one.stdout, re.M) and re.search(rf"^exit code\s+{code}$", one.stdout,
                                                                               re.M), one.stdout
        logs = s.cli("logs", j)
        assert logs.returncode == 0, logs.stderr
        assert f"about to {name}" in logs.stdout, logs.stdout
        trail = [r["event"] for r in json.loads(s.cli("audit", "--json", "--job", j).stdout)]
        assert trail[0] == "submission" and trail[-1] == "completion" and trail.count("completion") == 1, trail
        assert job(s, j)["attempts"] == 1  # a crash is the job's outcome: not requeued, not rerun
    table = s.cli("status").stdout
    assert "SIGABRT" in table and "SIGSEGV" in table, table
    # the GPUs the crashed jobs held are free again: a job wanting all four runs normally
    nxt = submit(s, QUICK, "--gpus", "4")
    assert wait_state(s, nxt, "done", "failed")["state"] == "done"
    assert "quick job ran" in s.cli("logs", nxt).stdout
    also = submit_http(s, QUICK, gpus=1)
    assert wait_state(s, also, "done", "failed")["state"] == "done"
    alive(s)
    assert 'rlsched_jobs{state="failed"} 3.0' in metrics(s)
