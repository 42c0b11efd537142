"""Running the scheduler service: in the foreground (``rlsched serve``) or detached (``rlsched apply``).

``serve`` starts the :class:`~rlsched.service.service.SchedulerService`, binds the
listening socket itself (so "address in use" is a one-line error and
``--listen 127.0.0.1:0`` picks a free port), runs uvicorn on it, and writes
``<state_dir>/server.json`` (pid, url, start time, spec) atomically once the port
answers. SIGTERM and SIGINT stop it gracefully: uvicorn finishes the requests in
flight, the scheduling loop stops, ``server.json`` is removed, and the exit
status is 0. Job processes are left running; the next service re-adopts them.

A service that dies without cleaning up (``kill -9``, power loss) leaves a stale
``server.json``; :func:`find_running` checks that the pid is alive, that
``/healthz`` answers with that pid, and that the pid holds the listening socket
(``/proc``) before believing it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlsched.errors import RlschedError
from rlsched.posix import atomic_write, pid_running
from rlsched.service.client import (
    DEFAULT_LISTEN,
    SERVER_FILE,
    Client,
    ServiceError,
    listener_owned_by,
    read_server_info,
)
from rlsched.service.statedir import FILE_MODE, ServiceLock, StateDirBusyError, holder_pid, open_private, secure_dir

if TYPE_CHECKING:
    from rlsched.service.config import ServiceConfig

log = logging.getLogger("rlsched.service")

#: Log file of a detached service, inside its state dir.
SERVICE_LOG = "service.log"


class DaemonError(RlschedError):
    """The service could not be started (or found)."""


@dataclass(frozen=True)
class ServerInfo:
    """What ``server.json`` says about a running service."""

    pid: int
    url: str
    started_at: float
    state_dir: str
    spec: list[str] = field(default_factory=list)
    listen: str = ""
    version: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServerInfo:
        return cls(pid=int(d["pid"]), url=str(d["url"]), started_at=float(d.get("started_at", 0.0)),
                   state_dir=str(d.get("state_dir", "")), spec=[str(s) for s in d.get("spec", [])],
                   listen=str(d.get("listen", "")), version=str(d.get("version", "")))


# --------------------------------------------------------------------------- addresses


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` -> (host, port); host defaults to 127.0.0.1."""
    s = listen.strip()
    if not s:
        raise DaemonError("--listen is empty; expected HOST:PORT, e.g. 127.0.0.1:8470")
    if s.isdigit():
        host, port_s = "127.0.0.1", s
    elif s.startswith("["):
        end = s.find("]")
        if end < 0 or not s[end + 1:].startswith(":"):
            raise DaemonError(f"--listen {listen!r}: expected [IPV6]:PORT")
        host, port_s = s[1:end], s[end + 2:]
    else:
        host, sep, port_s = s.rpartition(":")
        if not sep or ":" in host:
            raise DaemonError(f"--listen {listen!r}: expected HOST:PORT (IPv6 as [ADDR]:PORT)")
    if not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise DaemonError(f"--listen {listen!r}: port must be a number from 0 to 65535")
    return host or "127.0.0.1", int(port_s)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket, or a one-line :class:`DaemonError` (address in use, not local, ...)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DaemonError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, _, proto, _, addr = infos[0]
    # proto must be IPPROTO_TCP (not 0): asyncio sets TCP_NODELAY only on accepted sockets whose proto says
    # TCP, and without it every keep-alive response waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = " (another rlsched service? pick another --listen port)" if exc.errno == 98 else ""
        raise DaemonError(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    sock.set_inheritable(False)
    return sock


# --------------------------------------------------------------------------- server.json


def find_running(state_dir: Path, *, timeout: float = 2.0) -> ServerInfo | None:
    """The service of ``state_dir`` if its ``server.json`` names a live process whose ``/healthz`` answers."""
    raw = read_server_info(Path(state_dir))
    if raw is None:
        return None
    try:
        info = ServerInfo.from_json(raw)
    except (KeyError, TypeError, ValueError):
        return None
    if not pid_running(info.pid):
        return None
    try:
        health = Client(info.url, token="-", timeout=timeout).health()
    except ServiceError:
        return None
    if health.get("pid") not in (None, info.pid):
        return None
    if not listener_owned_by(info.url, info.pid):  # /healthz answers are anyone's to forge; /proc is not
        return None
    return info


# --------------------------------------------------------------------------- foreground


def _server_class() -> Any:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn.Server that exits normally on SIGTERM/SIGINT instead of re-raising the signal."""

        on_started: Any = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.on_started is not None and not self.should_exit:
                self.on_started()

    return _Server


#: The ``detail`` of the 400 answered to a request the HTTP parser rejects (before the app sees it).
BAD_HTTP_DETAIL = ("malformed HTTP request: the request line or a header is invalid (e.g. a Content-Length that "
                   "is not a number)")


def _protocol_class() -> Any:
    """uvicorn's h11 protocol, answering requests it cannot parse in the API's JSON shape."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonErrorH11Protocol(H11Protocol):
        """H11Protocol whose 400 for an unparseable request is ``{"detail": "..."}`` like every API error."""

        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"detail": BAD_HTTP_DETAIL}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers,
                                                             reason=b"Bad Request")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
            self.transport.close()

    return JsonErrorH11Protocol


def serve(config: ServiceConfig, listen: str = DEFAULT_LISTEN, *, log_level: str = "info",
          access_log: bool = False, announce: Any = None) -> int:
    """Run the service in the foreground until SIGTERM/SIGINT; returns the exit status (0 = clean stop).

    Args:
        config: what to serve.
        listen: ``HOST:PORT``; a non-loopback host is allowed (it was asked for) but warned about.
        log_level: uvicorn/rlsched log level.
        access_log: log every HTTP request.
        announce: called with the :class:`ServerInfo` once the port answers (the CLI prints it).
    """
    host, port = parse_listen(listen)
    state_dir = Path(config.state_dir).resolve()
    # The state dir's lock comes first: a second service on the same dir must not touch anything.
    lock = ServiceLock(state_dir)
    try:
        lock.acquire()
    except StateDirBusyError as exc:
        running = find_running(state_dir)
        holder = f"pid {exc.pid}" if exc.pid is not None else "pid not yet written"
        if running is not None and running.pid == exc.pid:
            holder += f", {running.url}"
        raise DaemonError(f"state dir {state_dir} is in use by another rlsched service ({holder}); stop it first "
                          f"(`rlsched stop --state-dir {state_dir}`), or reload it with `rlsched apply`") from None
    try:
        return _serve_locked(config, state_dir, host, port, log_level=log_level, access_log=access_log,
                             announce=announce)
    finally:
        lock.release()


def _serve_locked(config: ServiceConfig, state_dir: Path, host: str, port: int, *, log_level: str,
                  access_log: bool, announce: Any) -> int:
    """:func:`serve` once the state dir's lock is held."""
    import uvicorn

    from rlsched.service.api import create_app
    from rlsched.service.auth import ensure_token
    from rlsched.service.service import SchedulerService

    secure_dir(state_dir)
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not is_loopback(host):
        log.warning("listening on %s, which is not a loopback address: anyone who can reach it and has the token "
                    "can submit jobs; put TLS in front of it (a reverse proxy) on untrusted networks", host)
    if config.public_read:
        log.warning("public read is on: anyone who can reach %s reads the fleet, the queue, quotas, decisions, "
                    "info and metrics without the token (job commands, cwd and paths redacted)", host)
    token = ensure_token(state_dir)
    sock = bind(host, port)
    actual_port = sock.getsockname()[1]
    url = _url(host, actual_port)
    try:
        service = SchedulerService(config)
        service.start()
    except BaseException:
        sock.close()
        raise
    server_file = state_dir / SERVER_FILE
    info = ServerInfo(pid=os.getpid(), url=url, started_at=time.time(), state_dir=str(state_dir),
                      spec=[str(Path(p).resolve()) for p in config.spec_paths], listen=f"{host}:{actual_port}",
                      version=_version())
    try:
        app = create_app(service, token, public_read=config.public_read)
        uconfig = uvicorn.Config(app, log_config=None, log_level=log_level, access_log=access_log, lifespan="off",
                                 timeout_graceful_shutdown=5, server_header=False, proxy_headers=False,
                                 http=_protocol_class())
        server = _server_class()(uconfig)

        def started() -> None:
            atomic_write(server_file, json.dumps(info.to_json(), indent=2) + "\n", mode=FILE_MODE)
            log.info("rlsched service %s ready at %s (state dir %s)", info.version, url, state_dir)
            if announce is not None:
                announce(info)

        server.on_started = started
        server.run(sockets=[sock])
    finally:
        with contextlib.suppress(OSError):
            current = read_server_info(state_dir)
            if current is not None and current.get("pid") == os.getpid():
                server_file.unlink()
        sock.close()
        log.info("stopping the scheduler loop (job processes keep running)")
        service.close()  # also gives a fleet's lease back, so another service may take the cluster at once
    return 0


def _version() -> str:
    import rlsched

    return rlsched.__version__


# --------------------------------------------------------------------------- detached


def serve_argv(config: ServiceConfig, listen: str) -> list[str]:
    """The ``rlsched serve`` command line reproducing ``config``."""
    argv = [sys.executable, "-m", "rlsched", "serve", *[str(Path(p).resolve()) for p in config.spec_paths],
            "--state-dir", str(Path(config.state_dir).resolve()), "--listen", listen]
    if config.backend:
        argv += ["--backend", config.backend]
    for arg in config.var_args():
        argv += ["--var", arg]
    if config.policy:
        argv += ["--policy", config.policy]
    if config.mode.value != "policy":
        argv.append(f"--{config.mode.value}")  # --shadow, --fallback-only
    if config.max_decision_latency_s is not None:
        argv += ["--max-decision-latency-ms", f"{config.max_decision_latency_s * 1000:g}"]
    if config.tick_s != 0.25:
        argv += ["--tick-ms", f"{config.tick_s * 1000:g}"]
    if config.grace_s != 10.0:
        argv += ["--grace", f"{config.grace_s:g}"]
    argv += ["--keep-history", str(float(config.history_max_age_s)) if config.history_max_age_s else "0",
             "--keep-jobs", str(config.history_max_jobs or 0)]
    if config.public_read:
        argv.append("--public-read")
    return argv


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(tail)


def start_detached(config: ServiceConfig, listen: str = DEFAULT_LISTEN, log_file: Path | None = None, *,
                   timeout: float = 60.0, env: dict[str, str] | None = None) -> ServerInfo:
    """Start ``rlsched serve`` in the background (own session, output to ``service.log``) and wait until it answers.

    Raises:
        DaemonError: it exited or did not answer within ``timeout`` seconds (the
            message quotes the end of its log).
    """
    state_dir = secure_dir(Path(config.state_dir).resolve())
    running = find_running(state_dir)
    if running is not None:
        return running
    log_path = Path(log_file) if log_file is not None else state_dir / SERVICE_LOG
    argv = serve_argv(config, listen)
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env, cwd=str(state_dir))
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            raise DaemonError(f"the rlsched service exited with status {code} while starting: "
                              f"{_log_tail(log_path) or 'no output'} (log: {log_path})")
        raw = read_server_info(state_dir)
        if raw is not None and raw.get("pid") == proc.pid:
            info = find_running(state_dir)
            if info is not None:
                return info
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            raise DaemonError(f"the rlsched service did not answer within {timeout:g} s: "
                              f"{_log_tail(log_path) or 'no output'} (log: {log_path})")
        time.sleep(0.1)


def stop_running(state_dir: Path, *, timeout: float = 15.0) -> ServerInfo | None:
    """SIGTERM the service of ``state_dir`` and wait for it to exit; returns what ran (None if nothing did).

    The service is the process holding the state dir's lock (the kernel's word, not a file's: a stale
    ``server.json`` or a recycled pid is never signalled).

    Raises:
        DaemonError: it did not exit within ``timeout`` seconds, or it is another user's.
    """
    state_dir = Path(state_dir)
    pid = holder_pid(state_dir)
    if pid is None:
        return None
    raw = read_server_info(state_dir)
    info: ServerInfo | None = None
    with contextlib.suppress(KeyError, TypeError, ValueError):
        info = ServerInfo.from_json(raw) if raw is not None else None
    if info is None or info.pid != pid:
        info = ServerInfo(pid=pid, url="(not announced)", started_at=0.0, state_dir=str(state_dir))
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return info
    except PermissionError:
        raise DaemonError(f"the service of {state_dir} (pid {pid}) belongs to another user") from None
    deadline = time.monotonic() + timeout
    while pid_running(pid):
        if time.monotonic() > deadline:
            raise DaemonError(f"the service (pid {pid}) did not stop within {timeout:g} s")
        time.sleep(0.05)
    return info
