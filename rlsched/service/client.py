"""A small HTTP client of the scheduler service, standard library only.

``rlsched submit`` must start fast (it may run thousands of times from a script),
so this module imports neither FastAPI nor httpx. Every failure becomes one
:class:`ServiceError` line: no service listening, a refused token, or the
server's own ``detail`` message.

Where the service is (first match wins):

1. ``--server URL`` (``host:port`` is accepted too),
2. ``$RLSCHED_SERVER``,
3. the ``server.json`` the service writes in its state dir: of ``--state-dir`` (or
   a spec's default state dir) when one is named, else of the one running service
   whose state dir is under ``./.rlsched-service/`` (``rlsched serve POOL.hcl``
   run from this directory, ``--listen 127.0.0.1:0`` included),
4. ``http://127.0.0.1:8470``.

The token: ``$RLSCHED_TOKEN``, else ``<state_dir>/token`` -- and the token file is
sent only to a server that provably owns it: either the user named both the
server and the state dir, or the address came from that state dir's
``server.json`` (a dir only its owner can write) AND the process ``server.json``
names is alive and holds the listening socket of that port (checked in
``/proc``). Nothing is ever asked of whoever listens on a port: a local user who
binds the default port first gets no token.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.errors import RlschedError
from rlsched.posix import pid_exists
from rlsched.service.auth import TOKEN_ENV, resolve_token

#: Environment variable with the service URL.
SERVER_ENV = "RLSCHED_SERVER"
#: Default listen address of ``rlsched serve`` and the default URL of clients.
DEFAULT_LISTEN = "127.0.0.1:8470"
DEFAULT_SERVER = f"http://{DEFAULT_LISTEN}"
#: Jobs asked for per ``GET /v1/jobs`` page.
JOBS_PAGE = 1000
#: The file ``rlsched serve`` writes in its state dir while it runs.
SERVER_FILE = "server.json"


class ServiceError(RlschedError):
    """The service could not be reached or refused a request; ``status`` is the HTTP status, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NoServiceError(ServiceError):
    """Nothing listens at the service URL."""


def normalise_url(server: str) -> str:
    """``host:port`` or a URL -> ``http://host:port`` (no trailing slash)."""
    s = server.strip()
    if not s:
        raise ServiceError("empty service address")
    if "://" not in s:
        s = "http://" + s
    parsed = urllib.parse.urlsplit(s)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ServiceError(f"{server!r} is not a service address (expected http://HOST:PORT or HOST:PORT)")
    return s.rstrip("/")


def read_server_info(state_dir: Path) -> dict[str, Any] | None:
    """The ``server.json`` of a state dir, or None if absent or unreadable."""
    try:
        data = json.loads((Path(state_dir) / SERVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("url"), str) else None


def spec_state_dir(spec: Path) -> Path:
    """The default state dir of a spec (as ``rlsched serve`` chooses it)."""
    from rlsched.service.config import default_state_dir

    return default_state_dir(Path(spec))


def owned_private_dir(path: Path) -> bool:
    """``path`` is a directory this user owns that nobody else may write to (so what is in it is the user's)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (any address), or None where ``/proc/net`` cannot tell."""
    found: set[str] | None = None
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        found = found or set()
        for line in lines:
            f = line.split()
            # local_address is HEXADDR:HEXPORT; state 0A is LISTEN; field 9 is the inode
            if len(f) > 9 and f[3] == "0A" and int(f[1].rpartition(":")[2], 16) == port:
                found.add(f[9])
    return found


def listener_owned_by(url: str, pid: int) -> bool:
    """Does process ``pid`` hold the socket listening on ``url``'s port?

    True only when ``/proc`` shows it (a socket of ``pid`` among the port's listening
    sockets); on a system without ``/proc/net`` it falls back to ``pid`` being alive.
    """
    if not pid_exists(pid):
        return False
    port = urllib.parse.urlsplit(url).port
    if port is None:
        return False
    inodes = _listening_inodes(port)
    if inodes is None:
        return True  # no /proc/net (not Linux): the live pid of a server.json in a private dir is all we have
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


@dataclass
class Target:
    """Where a client sends its requests, how that was decided, and whether the token file may go there.

    Attributes:
        url: the service URL.
        state_dir: the state dir whose token file the client may read (None: none known).
        source: how ``url`` was found (for messages).
        tried: what discovery looked at, in order (for the "no service" message).
        server_pid: the pid ``server.json`` names, when ``url`` came from one.
        explicit: the user named the server (``--server`` / ``$RLSCHED_SERVER``).
    """

    url: str
    state_dir: Path | None = None
    source: str = "the default address"
    tried: list[str] = field(default_factory=list)
    server_pid: int | None = None
    explicit: bool = False

    def token_file_allowed(self) -> bool:
        """May the token file of ``state_dir`` be sent to ``url``? (see the module doc)"""
        if self.state_dir is None or not owned_private_dir(self.state_dir):
            return False
        if self.server_pid is not None:
            return listener_owned_by(self.url, self.server_pid)
        return self.explicit


def _live_server_json(state_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """(server.json of a running service, "") or (None, why not) for ``state_dir``."""
    info = read_server_info(state_dir)
    if info is None:
        return None, f"no server.json in {state_dir}"
    pid = info.get("pid")
    if not isinstance(pid, int) or not pid_exists(pid):
        return None, f"{state_dir / SERVER_FILE} names pid {pid}, which is not running"
    return info, ""


def discover_local(cwd: Path | None = None) -> tuple[list[tuple[Path, dict[str, Any]]], str]:
    """Running services whose state dirs are under ``<cwd>/.rlsched-service/`` and belong to this user.

    Returns the (state dir, server.json) pairs found, and a description of where it looked.
    """
    base = Path(cwd if cwd is not None else os.getcwd()) / ".rlsched-service"
    found: list[tuple[Path, dict[str, Any]]] = []
    with contextlib.suppress(OSError):
        for sd in sorted(base.iterdir()):
            if not owned_private_dir(sd):
                continue
            info, _ = _live_server_json(sd)
            if info is not None:
                found.append((sd, info))
    return found, f"no running service's server.json under {base}/*/"


def resolve_target(server: str | None = None, *, spec: Path | None = None, state_dir: Path | None = None,
                   env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Target:
    """The :class:`Target` a client should talk to (see the module doc for the order)."""
    environ = os.environ if env is None else env
    sd = Path(state_dir) if state_dir is not None else (spec_state_dir(spec) if spec is not None else None)
    if server:
        return Target(normalise_url(server), sd, "--server", explicit=True)
    if environ.get(SERVER_ENV, "").strip():
        return Target(normalise_url(environ[SERVER_ENV]), sd, f"${SERVER_ENV}", explicit=True)
    tried = ["no --server", f"no ${SERVER_ENV}"]
    if sd is not None:
        info, why = _live_server_json(sd)
        if info is not None:
            return Target(normalise_url(info["url"]), sd, f"{sd / SERVER_FILE}", tried, server_pid=info["pid"])
        tried.append(why)
        return Target(DEFAULT_SERVER, sd, "the default address", tried)
    found, where = discover_local(cwd)
    if len(found) > 1:
        listing = ", ".join(f"{d} ({i['url']})" for d, i in found)
        raise ServiceError(f"several rlsched services run from this directory: {listing}; choose one with "
                           "--state-dir")
    if found:
        d, info = found[0]
        return Target(normalise_url(info["url"]), d, f"{d / SERVER_FILE}", tried, server_pid=info["pid"])
    tried.append(where)
    return Target(DEFAULT_SERVER, None, "the default address", tried)


class Client:
    """Talk to one scheduler service.

    Args:
        url: the service, e.g. ``http://127.0.0.1:8470``.
        token: bearer token; None: ``$RLSCHED_TOKEN``, else the token file of
            ``state_dir`` when ``target`` allows sending it (see the module doc).
        state_dir: where to look for the token file.
        timeout: seconds to wait for each answer.
        target: how ``url`` was found (decides whether the token file may be sent, and what the
            "no service" message says); default: the caller named ``url`` and ``state_dir`` itself.
    """

    def __init__(self, url: str, token: str | None = None, *, state_dir: Path | None = None,
                 timeout: float = 30.0, target: Target | None = None) -> None:
        self.url = normalise_url(url)
        self.state_dir = state_dir
        self.timeout = timeout
        self.target = target if target is not None else Target(self.url, state_dir, "the caller", explicit=True)
        self._token = token
        self._token_resolved = token is not None

    # ------------------------------------------------------------------ plumbing
    @property
    def token(self) -> str | None:
        if not self._token_resolved:
            self._token = resolve_token(None)
            if self._token is None and self.state_dir is not None and self.target.token_file_allowed():
                self._token = resolve_token(self.state_dir)
            self._token_resolved = True
        return self._token

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
                body: Any = None, headers: Mapping[str, str] | None = None, auth: bool = True,
                retries: int = 0) -> tuple[int, dict[str, str], bytes]:
        """One request; returns (status, headers, body) of a 2xx answer, raises :class:`ServiceError` otherwise.

        ``retries`` re-sends after a dropped connection or a timeout (only for
        requests that are safe to repeat: reads, and submissions with an
        idempotency key).
        """
        url = self.url + path
        if query:
            items = query.items() if isinstance(query, Mapping) else query
            url += "?" + urllib.parse.urlencode([(k, v) for k, v in items if v is not None])
        data = None
        hdrs = {"Accept": "application/json", "User-Agent": "rlsched-client"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        if auth and self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        hdrs.update(headers or {})
        attempt = 0
        while True:
            req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
            except urllib.error.HTTPError as exc:
                raise self._http_error(exc) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                if isinstance(reason, ConnectionRefusedError) or (
                        isinstance(reason, OSError) and reason.errno in (111, 61)):
                    raise NoServiceError(self._no_service()) from None
                if attempt < retries and isinstance(reason, (ConnectionError, socket.timeout, TimeoutError)):
                    attempt += 1
                    time.sleep(min(2.0, 0.2 * 2 ** attempt))
                    continue
                if isinstance(reason, (socket.timeout, TimeoutError)):
                    raise ServiceError(f"the rlsched service at {self.url} did not answer within "
                                       f"{self.timeout:g} s") from None
                if isinstance(reason, socket.gaierror):
                    raise NoServiceError(f"cannot resolve the service host of {self.url} ({reason.strerror})") from None
                raise ServiceError(f"cannot reach the rlsched service at {self.url}: {reason}") from None

    def _no_service(self) -> str:
        t = self.target
        tried = "; ".join(t.tried)
        return (f"no rlsched service at {self.url} ({t.source}{': ' + tried if tried else ''}); start one with "
                "`rlsched serve POOL.hcl` from this directory, or name it with --state-dir DIR or --server URL")

    def _http_error(self, exc: urllib.error.HTTPError) -> ServiceError:
        try:
            raw = exc.read()
        except OSError:
            raw = b""
        detail = ""
        with contextlib.suppress(ValueError, AttributeError):
            doc = json.loads(raw.decode("utf-8", "replace"))
            detail = doc.get("detail", "") if isinstance(doc, dict) else ""
            if not isinstance(detail, str):
                detail = json.dumps(detail)
        if not detail:
            detail = raw.decode("utf-8", "replace").strip()[:300] or exc.reason or "no details"
        detail = " ".join(str(detail).split())
        if exc.code == 401:
            if not self.token:
                if self.state_dir is not None and not self.target.token_file_allowed():
                    where = (f"; the token file of {self.state_dir} is not sent to {self.url}, which that state "
                             "dir's server.json does not show to be its service (pass --server too if it is)")
                elif self.state_dir is not None:
                    where = f" or make {self.state_dir / 'token'} readable"
                else:
                    where = " or pass --state-dir DIR (the service's state dir)"
                return ServiceError(f"the service at {self.url} needs a token: set {TOKEN_ENV}{where} "
                                    "(the service writes it to <state_dir>/token)", 401)
            return ServiceError(f"the service at {self.url} refused the token ({detail}); check {TOKEN_ENV} "
                                "or the token file in the service's state dir", 401)
        if exc.code == 404 and detail == "Not Found":
            return ServiceError(f"{self.url} does not look like an rlsched service (404 on {exc.url})", 404)
        return ServiceError(detail, exc.code)

    def get_json(self, path: str, **kw: Any) -> Any:
        _, _, raw = self.request("GET", path, retries=2, **kw)
        return json.loads(raw)

    def post_json(self, path: str, body: Any = None, **kw: Any) -> Any:
        _, _, raw = self.request("POST", path, body=body, **kw)
        return json.loads(raw)

    # ------------------------------------------------------------------ API
    def health(self) -> dict[str, Any]:
        out = self.get_json("/healthz", auth=False)
        return out if isinstance(out, dict) else {}

    def submit(self, job: Mapping[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job (the body of ``POST /v1/jobs``); retried safely under an idempotency key."""
        key = idempotency_key or f"cli-{uuid.uuid4().hex}"
        out: dict[str, Any] = self.post_json("/v1/jobs", dict(job), headers={"Idempotency-Key": key}, retries=3)
        return out

    def jobs(self, states: Sequence[str] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` matching jobs in submission order; every one (paged) when ``limit`` is None."""
        out: list[dict[str, Any]] = []
        before: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("state", s) for s in states or ()]
            page = JOBS_PAGE if limit is None else min(JOBS_PAGE, limit - len(out))
            query.append(("limit", page))
            if before is not None:
                query.append(("before", before))
            _, headers, raw = self.request("GET", "/v1/jobs", query=query, retries=2)
            got: list[dict[str, Any]] = json.loads(raw)
            out[:0] = got
            before = headers.get("x-rlsched-next-before")
            if not before or not got or (limit is not None and len(out) >= limit):
                return out

    def job(self, job_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.get_json(f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}")
        return out

    def cancel(self, job_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.post_json(f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}/cancel", retries=2)
        return out

    def logs(self, job_id: str, *, tail: int | None = None, offset: int | None = None) -> tuple[bytes, int, str]:
        """(bytes, next offset, job state) of a job's log."""
        _, headers, raw = self.request("GET", f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}/logs",
                                       query={"tail": tail, "offset": offset}, retries=2)
        nxt = int(headers.get("x-rlsched-log-next", (offset or 0) + len(raw)))
        return raw, nxt, headers.get("x-rlsched-job-state", "")

    def audit(self, *, since: int | None = None, since_time: float | None = None, job: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.get_json("/v1/audit", query={"since": since, "since_time": since_time,
                                                                      "job": job, "limit": limit})
        return out

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = self.get_json("/v1/info")
        return out

    def reload(self, spec_paths: Sequence[str | Path] | None = None, policy: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if spec_paths:
            body["spec_paths"] = [str(p) for p in spec_paths]
        if policy:
            body["policy"] = policy
        out: dict[str, Any] = self.post_json("/v1/reload", body)
        return out

    def metrics(self) -> str:
        _, _, raw = self.request("GET", "/metrics", retries=2)
        return raw.decode("utf-8", "replace")


def connect(server: str | None = None, *, spec: Path | None = None, state_dir: Path | None = None,
            timeout: float = 30.0) -> Client:
    """A :class:`Client` for the service named by the arguments and the environment (see the module doc)."""
    target = resolve_target(server, spec=spec, state_dir=state_dir)
    return Client(target.url, state_dir=target.state_dir, timeout=timeout, target=target)
