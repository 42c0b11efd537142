"""``rlsched serve | submit | status | cancel | logs | audit``: the scheduler service and its clients.

``serve`` runs the service in the foreground (for systemd or a container); the
other commands talk to a running service over HTTP through
:mod:`rlsched.service.client` (standard library only, so they start fast). They
take ``--server URL`` (default ``$RLSCHED_SERVER``, else the ``server.json`` of
``--state-dir``, else ``http://127.0.0.1:8470``); the token comes from
``$RLSCHED_TOKEN`` or the service's token file. Every failure is one ``error:``
line on stderr and exit status 1.

``submit`` prints the job id and nothing else on stdout, so
``JOB=$(rlsched submit --gpus 1 -- python train.py)`` works.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlsched.cli.app import app
from rlsched.errors import RlschedError

if TYPE_CHECKING:
    from rlsched.service.client import Client

ServerOpt = Annotated[str | None, typer.Option(
    "--server", help="Service URL (or HOST:PORT); default: $RLSCHED_SERVER, else the server.json of --state-dir, "
                     "else http://127.0.0.1:8470.")]
ClientStateDirOpt = Annotated[Path | None, typer.Option(
    "--state-dir", help="The service's state dir (to find its address and token file).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_DURATION_FULL = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d|w)\s*)+$", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """``90``, ``90s``, ``15m``, ``1h30m``, ``2d`` -> seconds."""
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        if not _DURATION_FULL.match(s):
            raise RlschedError(f"{what} {text!r}: expected a duration like 90s, 15m, 1h30m or 2d") from None
        value = sum(float(n) * _UNITS[u.lower()] for n, u in _DURATION.findall(s))
    if value < 0:
        raise RlschedError(f"{what} {text!r}: must not be negative")
    return value


def parse_time(text: str, what: str = "time", *, now: float | None = None, past: bool = False) -> float:
    """An absolute time as Unix seconds: ISO 8601 (local time unless it has an offset), ``+2h`` from now,
    a Unix timestamp, or (with ``past``) a duration meaning that long ago (``10m``)."""
    s = text.strip()
    now = time.time() if now is None else now
    if s.startswith("+"):
        return now + parse_duration(s[1:], what)
    if past and s.startswith("-"):
        return now - parse_duration(s[1:], what)
    if past and _DURATION_FULL.match(s):
        return now - parse_duration(s, what)
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if value > 1e9:
            return value
        raise RlschedError(f"{what} {text!r}: a bare number is read as a Unix time; "
                           f"use +{s}s for 'in {s} seconds'")
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
    except ValueError:
        hint = "+2h, 2030-01-31T18:00, 2030-01-31 18:00+01:00" + (", 10m (ago)" if past else "")
        raise RlschedError(f"{what} {text!r}: expected an ISO time or a relative time ({hint})") from None
    return dt.timestamp()


def parse_memory_gib(text: str) -> float:
    """``32``, ``32G``, ``32GiB``, ``512M``, ``1T`` -> GiB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise RlschedError(f"--memory {text!r}: expected GiB (32) or a size with unit (512M, 32G, 1T)")
    scale = {"": 1.0, "k": 1 / 1024 ** 2, "m": 1 / 1024, "g": 1.0, "t": 1024.0}[m.group(2).lower()]
    value = float(m.group(1)) * scale
    if value <= 0:
        raise RlschedError(f"--memory {text!r}: must be more than 0")
    return value


def _client(server: str | None, state_dir: Path | None) -> Client:
    from rlsched.service.client import connect

    return connect(server, state_dir=state_dir)


def _parse_vars(var: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in var or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise RlschedError(f"--var {item!r}: expected NAME=VALUE")
        out[name.strip()] = value
    return out


# --------------------------------------------------------------------------- serve


@app.command("serve")
def serve_cmd(
    specs: Annotated[list[Path], typer.Argument(help="Pool spec files (.hcl) or directories.", show_default=False)],
    backend: Annotated[str | None, typer.Option(
        "--backend", help="nvml, sim:PATH.json or ray:auto / ray:HOST:PORT (a Ray cluster); "
                          "default: $RLSCHED_BACKEND.")] = None,
    listen: Annotated[str, typer.Option(
        "--listen", help="HOST:PORT to serve on (port 0: any free port). Anything but loopback exposes the API "
                         "to the network.")] = "127.0.0.1:8470",
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", help="Queue, allocations, decisions, audit (SQLite, WAL), job logs and the token; default: "
                            ".rlsched-service/<spec name> beside the spec.")] = None,
    fallback_only: Annotated[bool, typer.Option(
        "--fallback-only", help="Pure heuristic mode: serve the policy's fallback, load no model.")] = False,
    shadow: Annotated[bool, typer.Option(
        "--shadow", help="The policy decides in parallel and is audited; the heuristic acts.")] = False,
    policy: Annotated[str | None, typer.Option(
        "--policy", help="Which policy block of the spec to serve (default: the only one, else 'default').")] = None,
    var: Annotated[list[str] | None, typer.Option("--var", help="Set a spec variable: NAME=VALUE (repeatable).")]
    = None,
    max_decision_latency_ms: Annotated[float | None, typer.Option(
        "--max-decision-latency-ms", min=0.001, help="Latency budget of one policy decision; slower ones fall "
                                                     "back to the heuristic (default: the policy's health block).")]
    = None,
    tick_ms: Annotated[float, typer.Option("--tick-ms", min=1.0, help="Scheduling loop period.")] = 250.0,
    grace: Annotated[float, typer.Option(
        "--grace", min=0.0, help="Seconds between SIGTERM and SIGKILL when a job is cancelled or preempted.")] = 10.0,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = "info",
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every HTTP request.")] = False,
    keep_history: Annotated[str, typer.Option(
        "--keep-history", help="Remove finished jobs (rows, logs) older than this, e.g. 30d, 12h; 0 keeps them "
                               "whatever their age. The audit trail is always kept.")] = "30d",
    keep_jobs: Annotated[int, typer.Option(
        "--keep-jobs", min=0, help="Keep at most this many finished jobs, the newest; 0: no count limit.")]
    = 100_000,
    public_read: Annotated[bool, typer.Option(
        "--public-read", help="Let readers without the token see the dashboard's fleet and queue: GET /v1/fleet, "
                              "/v1/quotas, /v1/decisions, /v1/jobs, /v1/jobs/ID, /v1/info and /metrics, with "
                              "each job's argv, cwd, idempotency key and log path redacted and no "
                              "paths in /v1/info. Logs, /v1/audit, /v1/trace and every POST (submit, cancel, "
                              "reload) still need the token. Off by default.")] = False,
) -> None:
    """Run the scheduler service in the foreground (SIGTERM/Ctrl-C stop it; running jobs keep running)."""
    from rlsched.service.config import ServiceConfig, ServiceMode, default_state_dir
    from rlsched.service.daemon import serve

    for p in specs:
        if not p.exists():
            raise RlschedError(f"{p}: no such spec file")
    if fallback_only and shadow:
        raise RlschedError("--fallback-only and --shadow exclude each other")
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        raise RlschedError(f"--log-level {log_level!r}: expected debug, info, warning or error")
    config = ServiceConfig(
        spec_paths=[p.resolve() for p in specs], state_dir=(state_dir or default_state_dir(specs[0])).resolve(),
        backend=_backend_string(backend), variables=_parse_vars(var), policy=policy,
        mode=ServiceMode.FALLBACK_ONLY if fallback_only else ServiceMode.SHADOW if shadow else ServiceMode.POLICY,
        tick_s=tick_ms / 1000.0, grace_s=grace,
        max_decision_latency_s=max_decision_latency_ms / 1000.0 if max_decision_latency_ms is not None else None,
        history_max_age_s=parse_duration(keep_history, "--keep-history") or None,
        history_max_jobs=keep_jobs or None, public_read=public_read)

    def announce(info: Any) -> None:
        typer.echo(f"rlsched service listening on {info.url} (state dir {info.state_dir}; token in "
                   f"{Path(info.state_dir) / 'token'})", err=True)

    code = serve(config, listen, log_level=log_level.lower(), access_log=access_log, announce=announce)
    raise typer.Exit(code)


@app.command("stop")
def stop_cmd(
    spec: Annotated[Path | None, typer.Argument(
        help="The pool spec the service serves (its default state dir is beside it); default: the one service "
             "running from this directory.", show_default=False)] = None,
    state_dir: ClientStateDirOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for it to exit.")] = 60.0,
) -> None:
    """Stop a running service (SIGTERM: requests in flight finish; running jobs keep running and are re-adopted)."""
    from rlsched.service.client import discover_local, spec_state_dir
    from rlsched.service.daemon import stop_running

    if state_dir is not None:
        sd = state_dir
    elif spec is not None:
        sd = spec_state_dir(spec)
    else:
        found, where = discover_local()
        if not found:
            raise RlschedError(f"no rlsched service runs from this directory ({where}); name it with "
                               "`rlsched stop SPEC` or --state-dir DIR")
        if len(found) > 1:
            listing = ", ".join(str(d) for d, _ in found)
            raise RlschedError(f"several rlsched services run from this directory ({listing}); choose one with "
                               "--state-dir")
        sd = found[0][0]
    sd = sd.resolve()
    info = stop_running(sd, timeout=timeout)
    if info is None:
        typer.echo(f"no rlsched service runs for state dir {sd}", err=True)
        return
    typer.echo(f"stopped the rlsched service at {info.url} (pid {info.pid}, state dir {sd}); its running jobs keep "
               "running and the next service re-adopts them", err=True)


def _backend_string(backend: str | None) -> str | None:
    s = backend or os.environ.get("RLSCHED_BACKEND") or None
    if s and s.startswith("sim:"):
        return "sim:" + str(Path(s[4:]).resolve())
    return s


# --------------------------------------------------------------------------- submit


@app.command("submit", context_settings={"allow_interspersed_args": False})
def submit_cmd(
    command: Annotated[list[str], typer.Argument(
        help="The program and its arguments, after --: run as given, never through a shell.", show_default=False,
        metavar="-- CMD [ARGS]...")],
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="Whole GPUs.")] = None,
    mig: Annotated[str | None, typer.Option("--mig", help="A MIG profile instead, e.g. 3g.40gb.")] = None,
    priority: Annotated[int, typer.Option("--priority", help="Higher runs first.")] = 0,
    user: Annotated[str | None, typer.Option("--user", help="Submitting principal; default: $USER.")] = None,
    preemptible: Annotated[bool, typer.Option(
        "--preemptible", help="May be stopped (SIGTERM, grace, SIGKILL) and requeued.")] = False,
    deadline: Annotated[str | None, typer.Option(
        "--deadline", help="Wanted completion: ISO time (2030-01-31T18:00) or from now (+2h).")] = None,
    cpus: Annotated[float | None, typer.Option("--cpus", min=0.001, help="Host CPUs.")] = None,
    memory: Annotated[str | None, typer.Option("--memory", help="Host memory: GiB, or with unit (512M, 32G).")]
    = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Run only in this pool.")] = None,
    estimate: Annotated[str | None, typer.Option("--estimate", help="Expected run time (90s, 15m, 1h30m).")] = None,
    idempotency_key: Annotated[str | None, typer.Option(
        "--idempotency-key", help="Retrying with the same key never queues the job twice (default: a fresh key "
                                  "per invocation, so network retries inside one call are safe).")] = None,
    server: ServerOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Submit a job; prints its id (only that, on stdout)."""
    if gpus is not None and mig is not None:
        raise RlschedError("give either --gpus or --mig, not both")
    if not command:
        raise RlschedError("no command given: rlsched submit --gpus 1 -- PROGRAM ARGS...")
    body: dict[str, Any] = {"argv": list(command), "priority": priority,
                            "user": user or os.environ.get("USER") or os.environ.get("LOGNAME") or "anonymous",
                            "preemptible": preemptible}
    with contextlib.suppress(OSError):
        body["cwd"] = os.getcwd()  # the job runs where it was submitted from
    if mig is not None:
        body["mig"] = mig
    else:
        body["gpus"] = gpus if gpus is not None else 1
    if deadline is not None:
        body["deadline"] = parse_time(deadline, "--deadline")
    if cpus is not None:
        body["cpus"] = cpus
    if memory is not None:
        body["memory_gib"] = parse_memory_gib(memory)
    if pool is not None:
        body["pool"] = pool
    if estimate is not None:
        est = parse_duration(estimate, "--estimate")
        if est <= 0:
            raise RlschedError(f"--estimate {estimate!r}: must be more than 0")
        body["estimated_duration_s"] = est
    out = _client(server, state_dir).submit(body, idempotency_key=idempotency_key)
    typer.echo(out["id"])


# --------------------------------------------------------------------------- status


@app.command("status")
def status_cmd(
    job: Annotated[str | None, typer.Argument(help="A job id; default: every job.", show_default=False)] = None,
    json_out: JsonOpt = False,
    all_jobs: Annotated[bool, typer.Option(
        "--all", help="Every finished job too (default: active jobs and the last 20 finished).")] = False,
    server: ServerOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Jobs and their state; for one job: allocation, and why a pending job waits and its place in the queue.

    In the table, AGE is the time since the job was submitted and RUNTIME how long its last run lasted
    (until now while it runs). The table fits the terminal ($COLUMNS); GPU UUIDs are never split.
    """
    from rlsched.report.jobs import job_detail_text, status_table
    from rlsched.report.terminal import output_console

    c = _client(server, state_dir)
    if job is not None:
        j = c.job(job)
        if json_out:
            typer.echo(json.dumps(j, indent=2, sort_keys=True))
            return
        typer.echo(job_detail_text(j))
        return
    if all_jobs:
        jobs = c.jobs()
    else:
        active = c.jobs(["queued", "running", "preempted"])
        finished = c.jobs(["done", "failed", "cancelled"], limit=20)
        jobs = sorted(active + finished, key=lambda j: (j.get("seq") or 0, j.get("submitted_at") or 0))
    if json_out:
        typer.echo(json.dumps(jobs, indent=2, sort_keys=True))
        return
    if not jobs:
        typer.echo("no jobs")
        return
    output_console().print(status_table(jobs), crop=False)


# --------------------------------------------------------------------------- cancel, logs


@app.command("cancel")
def cancel_cmd(
    jobs: Annotated[list[str], typer.Argument(help="Job ids.", show_default=False)],
    server: ServerOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Cancel jobs: a queued one at once, a running one by SIGTERM, a grace period, then SIGKILL."""
    from rlsched.report.terminal import escape_control

    c = _client(server, state_dir)
    for job in jobs:
        out = c.cancel(job)
        state = out.get("state")
        line = f"{job}: {state} (stopping)" if state in ("running", "preempted") else f"{job}: {state}"
        typer.echo(escape_control(line))


@app.command("logs")
def logs_cmd(
    job: Annotated[str, typer.Argument(help="A job id.", show_default=False)],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", min=0, help="Only the last N bytes.")] = None,
    raw: Annotated[bool, typer.Option(
        "--raw", help="Write the bytes as captured even to a terminal (default there: control characters "
                      "other than newline, tab and carriage return are shown escaped, e.g. \\e).")] = False,
    server: ServerOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Print a job's output (stdout and stderr, as captured; byte for byte to a pipe or file)."""
    from rlsched.report.terminal import LogWriter

    c = _client(server, state_dir)
    out = LogWriter(sys.stdout.buffer, escape=sys.stdout.isatty() and not raw)
    data, nxt, state = c.logs(job, tail=tail, offset=None if tail is not None else 0)
    out.write(data)
    # Without --tail the first answer may stop at the server's chunk limit: page on.
    while data and tail is None and not follow:
        data, nxt, state = c.logs(job, offset=nxt)
        out.write(data)
    if not follow:
        out.write(b"", final=True)
        return
    terminal = ("done", "failed", "cancelled")
    try:
        while True:
            data, nxt, state = c.logs(job, offset=nxt)
            if data:
                out.write(data)
                continue
            if state in terminal:
                # one last read: the process may have written after our previous poll
                data, nxt, state = c.logs(job, offset=nxt)
                out.write(data, final=True)
                return
            time.sleep(0.5)
    except KeyboardInterrupt:
        return


# --------------------------------------------------------------------------- audit


@app.command("audit")
def audit_cmd(
    since: Annotated[str | None, typer.Option(
        "--since", help="Records after this audit id (a small integer), or since a time: ISO, or a duration ago "
                        "(10m, 2h).")] = None,
    job: Annotated[str | None, typer.Option("--job", help="Only this job's records.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100_000, help="At most this many records.")] = 1000,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """The audit trail: submissions, allocations, preemptions, MIG changes, policy switches, fallbacks."""
    from rlsched.report.jobs import audit_table
    from rlsched.report.terminal import output_console

    since_id: int | None = None
    since_time: float | None = None
    if since is not None:
        s = since.strip()
        if s.isdigit() and int(s) < 1_000_000_000:
            since_id = int(s)
        else:
            since_time = parse_time(s, "--since", past=True)
    recs = _client(server, state_dir).audit(since=since_id, since_time=since_time, job=job, limit=limit)
    if json_out:
        typer.echo(json.dumps(recs, indent=2, sort_keys=True))
        return
    if not recs:
        typer.echo("no audit records")
        return
    output_console().print(audit_table(recs), crop=False)
