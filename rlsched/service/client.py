"""A small HTTP client of the scheduler service, standard library only.

``rlsched submit`` must start fast (it may run thousands of times from a script),
so this module imports neither FastAPI nor httpx. Every failure becomes one
:class:`ServiceError` line: no service listening, a refused token, or the
server's own ``detail`` message.

Where the service is (first match wins):

1. ``--server URL`` (``host:port`` is accepted too),
2. ``$RLSCHED_SERVER``,
3. the ``server.json`` the service writes in its state dir (when a state dir, or a
   spec whose default state dir holds one, is known),
4. ``http://127.0.0.1:8470``.

The token: ``$RLSCHED_TOKEN``, else ``<state_dir>/token``. When neither is known,
the client asks the (unauthenticated) ``/healthz`` where the service keeps its
state: a loopback service says, and a user allowed to read its token file then
needs no configuration at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlsched.errors import RlschedError
from rlsched.service.auth import TOKEN_ENV, resolve_token

#: Environment variable with the service URL.
SERVER_ENV = "RLSCHED_SERVER"
#: Default listen address of ``rlsched serve`` and the default URL of clients.
DEFAULT_LISTEN = "127.0.0.1:8470"
DEFAULT_SERVER = f"http://{DEFAULT_LISTEN}"
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


def resolve_server(server: str | None = None, *, spec: Path | None = None,
                   state_dir: Path | None = None, env: Mapping[str, str] | None = None) -> tuple[str, Path | None]:
    """(URL, state dir or None) of the service a client should talk to (see the module doc)."""
    environ = os.environ if env is None else env
    sd = Path(state_dir) if state_dir is not None else (spec_state_dir(spec) if spec is not None else None)
    if server:
        return normalise_url(server), sd
    if environ.get(SERVER_ENV, "").strip():
        return normalise_url(environ[SERVER_ENV]), sd
    if sd is not None:
        info = read_server_info(sd)
        if info is not None:
            return normalise_url(info["url"]), sd
    return DEFAULT_SERVER, sd


class Client:
    """Talk to one scheduler service.

    Args:
        url: the service, e.g. ``http://127.0.0.1:8470``.
        token: bearer token; None: discover it (see the module doc) on first need.
        state_dir: where to look for the token file.
        timeout: seconds to wait for each answer.
    """

    def __init__(self, url: str, token: str | None = None, *, state_dir: Path | None = None,
                 timeout: float = 30.0) -> None:
        self.url = normalise_url(url)
        self.state_dir = state_dir
        self.timeout = timeout
        self._token = token
        self._token_resolved = token is not None

    # ------------------------------------------------------------------ plumbing
    @property
    def token(self) -> str | None:
        if not self._token_resolved:
            self._token = resolve_token(self.state_dir)
            if self._token is None and self.state_dir is None:
                with contextlib.suppress(ServiceError):
                    sd = self.health().get("state_dir")
                    if isinstance(sd, str) and sd:
                        self.state_dir = Path(sd)
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
                    raise NoServiceError(f"no rlsched service at {self.url} "
                                         f"(start it with `rlsched serve POOL.hcl`)") from None
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
                where = f" or make {self.state_dir / 'token'} readable" if self.state_dir else ""
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
        query: list[tuple[str, Any]] = [("state", s) for s in states or ()]
        if limit is not None:
            query.append(("limit", limit))
        out: list[dict[str, Any]] = self.get_json("/v1/jobs", query=query)
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
    url, sd = resolve_server(server, spec=spec, state_dir=state_dir)
    return Client(url, state_dir=sd, timeout=timeout)
