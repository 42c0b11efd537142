"""The scheduler service's HTTP API (FastAPI), described by OpenAPI at ``/openapi.json``.

Endpoints (all under a bearer token except ``/healthz``, ``/docs`` and ``/openapi.json``)::

    POST /v1/jobs                 submit (201, the job; Idempotency-Key header: a retry gets the same job)
    GET  /v1/jobs                 list (?state=queued&state=running, ?limit=N: the last N, default 1000;
                                  ?before=SEQ pages back, see the X-Rlsched-Next-Before header)
    GET  /v1/jobs/{id}            one job, with the reason and queue position of a pending one
    POST /v1/jobs/{id}/cancel     cancel (queued: at once; running: SIGTERM, grace, SIGKILL)
    GET  /v1/jobs/{id}/logs       the job's stdout+stderr (?tail=N last bytes, ?offset=N from byte N)
    GET  /v1/audit                audit records (?since=ID cursor, ?since_time=EPOCH, ?job=ID, ?limit=N)
    GET  /v1/info                 policy, pools, backend, queue counts
    POST /v1/reload               hot-swap the spec and/or policy (jobs are kept)
    GET  /v1/fleet                nodes, GPUs, MIG instances and their jobs; nodes held and cost
    GET  /v1/quotas               each quota's use; what each user holds
    GET  /v1/decisions            the scheduler's last decisions (?limit=N)
    GET  /v1/trace                the job history as a canonical trace CSV (?since_s=N, ?with_commands=true)
    GET  /metrics                 Prometheus text format
    GET  /ui/                     the live web dashboard (static; no token to load, the API calls need it)
    GET  /healthz                 liveness, and whether public read is on (no token)

The API documentation itself (``/docs``, ``/openapi.json``) is left open: it holds
no data, and tools that generate clients need it without credentials. Every
endpoint that reads jobs, logs, audit or metrics, or changes anything, needs
``Authorization: Bearer <token>`` (compared in constant time).

Public read (``rlsched serve --public-read``, off by default) lets anyone who can reach the port read
what the dashboard shows of the fleet and the queue without a token: ``GET /v1/fleet``, ``/v1/quotas``,
``/v1/decisions``, ``/v1/jobs``, ``/v1/jobs/{id}``, ``/v1/info`` and ``/metrics`` (:data:`PUBLIC_READS`).
Anonymous readers get job views with the job-supplied strings that may carry secrets replaced by
:data:`REDACTED` (argv, cwd, environment, idempotency key) and the job's log path hidden, and ``/v1/info``
without paths on the service's machine (state dir, spec files, the backend's file). Logs, the audit
trail, the trace export and every ``POST`` still need the token; a wrong token is refused (401) even
then, so a mistyped login never silently reads as anonymous.

Errors are always JSON ``{"detail": "<one line>"}``: 401 (token), 403 (quota),
404 (unknown job), 409 (idempotency key reused for another request), 413 (body
over ``max_body_bytes``), 422 (invalid request: the message names the field), 500
(a bug: logged by the service with its traceback, never sent to the client).

Handlers are plain ``def`` functions: FastAPI runs them in its thread pool, so the
service's blocking SQLite calls never stall the event loop.
"""

import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

import rlsched
from rlsched.errors import RlschedError
from rlsched.service.auth import token_matches

if TYPE_CHECKING:
    from rlsched.runtime.audit import AuditRecord

log = logging.getLogger("rlsched.service.api")

#: Default largest request body accepted (bytes); larger requests get 413.
MAX_BODY_BYTES = 64 * 1024
#: Jobs one ``GET /v1/jobs`` returns by default and at most (clients page back with ``?before=``).
DEFAULT_PAGE, MAX_PAGE = 1000, 10_000
#: Most bytes one /logs response returns (clients page with ?offset=).
MAX_LOG_CHUNK = 8 * 1024 * 1024
MAX_GPUS = 1024
#: Latest deadline accepted (year 9999): later ones are not times anyone means.
MAX_DEADLINE = 253_402_300_799
#: Largest id cursor (SQLite integers are signed 64-bit).
MAX_ID = 2**63 - 1
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
MAX_ARGV = 1024
MAX_ARG_LEN = 8192
USER_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.@:+-]{0,63}$"
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
MIG_PATTERN = r"^[1-7]g\.[0-9]{1,3}gb(\+me)?$"
IDEMPOTENCY_PATTERN = r"^[\x21-\x7e]{1,200}$"
JOB_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"

#: What an anonymous reader (public read) sees in place of a job-supplied string that may hold a secret.
REDACTED = "[redacted: log in to see]"
#: The reads ``--public-read`` opens to readers without a token (method, path).
PUBLIC_READS = (("GET", "/v1/fleet"), ("GET", "/v1/quotas"), ("GET", "/v1/decisions"), ("GET", "/v1/jobs"),
                ("GET", "/v1/jobs/{job_id}"), ("GET", "/v1/info"), ("GET", "/metrics"))
#: Request fields of a job view replaced by :data:`REDACTED` for anonymous readers (argv too, as one item).
REDACTED_REQUEST_FIELDS = ("cwd", "env", "environment", "idempotency_key")
#: ``/v1/info`` fields replaced by :data:`REDACTED` for anonymous readers (paths on the service's machine).
REDACTED_INFO_FIELDS = ("state_dir", "spec")

JobId = Annotated[str, PathParam(pattern=JOB_ID_PATTERN, description="A job id, e.g. j-0123456789abcdef.")]

#: What each pattern means, for validation messages.
PATTERN_WORDS = {
    USER_PATTERN: "1-64 letters, digits or _.@:+- (not starting with punctuation)",
    NAME_PATTERN: "a name: a letter or _, then letters, digits, _ or - (at most 64)",
    IDEMPOTENCY_PATTERN: "1-200 printable ASCII characters without spaces",
    JOB_ID_PATTERN: "a job id: 1-64 letters, digits or _.-",
}

TAGS = [
    {"name": "jobs", "description": "Submit, inspect and cancel jobs; read their logs."},
    {"name": "audit", "description": "The append-only audit trail of every scheduler act."},
    {"name": "service", "description": "Service information, spec/policy reload, metrics and health."},
]


class ServiceLike(Protocol):
    """What the API needs of :class:`rlsched.service.service.SchedulerService`."""

    registry: Any

    def submit(self, req: Any) -> Any: ...
    def cancel(self, job_id: str) -> Any: ...
    def job_status(self, job_id: str) -> dict[str, Any]: ...
    def jobs(self, states: list[str] | None = None, limit: int | None = None,
             before: int | None = None) -> list[dict[str, Any]]: ...
    def log_path(self, job_id: str) -> Path: ...
    def audit(self, since: int | None = None, job: str | None = None,
              limit: int | None = None) -> "list[AuditRecord]": ...
    def reload(self, spec_paths: list[Path] | None = None, *, policy: str | None = None) -> dict[str, Any]: ...
    def info(self) -> dict[str, Any]: ...
    def trace_csv(self, since_s: float | None = None, with_commands: bool = False) -> str: ...


def known_mig_profiles() -> frozenset[str]:
    """Every MIG profile name some GPU model of the catalogue has."""
    from rlsched.cluster.catalog import CATALOG

    return frozenset(p.name for m in CATALOG.values() for p in m.mig_profiles)


# --------------------------------------------------------------------------- models


class JobStateName(str, Enum):
    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"
    preempted = "preempted"


Arg = Annotated[str, Field(max_length=MAX_ARG_LEN)]


class SubmitBody(BaseModel):
    """A job: a command (argv list, never a shell string) and what it needs."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"argv": ["python", "train.py", "--epochs", "3"], "gpus": 1, "priority": 5, "user": "alice"},
        {"argv": ["python", "rollout.py"], "mig": "1g.10gb", "preemptible": True},
    ]})

    argv: list[Arg] = Field(min_length=1, max_length=MAX_ARGV,
                            description="Program and arguments, run without a shell; argv[0] must not be empty.")
    gpus: StrictInt | None = Field(None, ge=1, le=MAX_GPUS, description="Whole GPUs (default 1 when no `mig`).")
    mig: str | None = Field(None, json_schema_extra={"pattern": MIG_PATTERN}, max_length=32,
                            description="A MIG profile instead of whole GPUs, e.g. `3g.40gb` (must exist in the "
                                        "GPU catalogue).")
    priority: StrictInt = Field(0, ge=MIN_PRIORITY, le=MAX_PRIORITY, description="Higher runs first.")
    user: str = Field("anonymous", pattern=USER_PATTERN, description="Who submits (quotas are per user/principal).")
    preemptible: StrictBool = Field(False, description="May be stopped (SIGTERM, grace, SIGKILL) and requeued.")
    deadline: StrictFloat | StrictInt | None = Field(None, gt=0, le=MAX_DEADLINE, allow_inf_nan=False,
                                                     description="Wanted completion, Unix epoch seconds.")
    cpus: StrictFloat | StrictInt | None = Field(None, gt=0, le=4096, allow_inf_nan=False, description="Host CPUs.")
    memory_gib: StrictFloat | StrictInt | None = Field(None, gt=0, le=65536, allow_inf_nan=False,
                                                       description="Host memory in GiB.")
    pool: str | None = Field(None, pattern=NAME_PATTERN, description="Run only in this pool.")
    estimated_duration_s: StrictFloat | StrictInt | None = Field(
        None, gt=0, le=366 * 86400, allow_inf_nan=False,
        description="The submitter's run-time estimate in seconds (helps SJF-like policies and backfilling).")
    idempotency_key: str | None = Field(None, pattern=IDEMPOTENCY_PATTERN,
                                        description="Same as the Idempotency-Key header (the header wins).")
    cwd: str | None = Field(None, min_length=1, max_length=4096,
                            description="Working directory of the job on the service's machine (an absolute path; "
                                        "default: the service's).")

    @field_validator("argv")
    @classmethod
    def _argv0(cls, v: list[str]) -> list[str]:
        if not v[0]:
            raise ValueError("argv[0] (the program) must not be empty")
        if any("\x00" in a for a in v):
            raise ValueError("arguments must not contain NUL characters")
        return v

    @field_validator("cwd")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or "\x00" in v):
            raise ValueError("must be an absolute path")
        return v

    @field_validator("mig")
    @classmethod
    def _known_mig(cls, v: str | None) -> str | None:
        if v is not None and v not in known_mig_profiles():
            legal = ", ".join(sorted(known_mig_profiles(), key=lambda p: (int(p.split("g.")[0]), p)))
            raise ValueError(f"unknown MIG profile {v!r}; known profiles: {legal}")
        return v

    @model_validator(mode="after")
    def _gpus_or_mig(self) -> "SubmitBody":
        if self.gpus is not None and self.mig is not None:
            raise ValueError("give either gpus or mig, not both")
        return self


class SubmitResult(BaseModel):
    id: str = Field(description="The job id (use it with status, cancel, logs).")
    state: str
    submitted_at: float | None = None


class RequestView(BaseModel):
    """How a job's request reads in the API's answers: a projection of
    :class:`~rlsched.runtime.job_request.JobRequest` (the one request type), kept as its own schema so
    the answers and ``/openapi.json`` list exactly these fields (a test holds them to JobRequest's)."""

    model_config = ConfigDict(extra="allow")

    argv: list[str]
    gpus: int | None = None
    mig: str | None = None
    preemptible: bool = False
    deadline: float | None = None
    cpus: float | None = None
    memory_gib: float | None = None
    pool: str | None = None
    estimated_duration_s: float | None = None
    cwd: str | None = None
    idempotency_key: str | None = None


class AllocationView(BaseModel):
    model_config = ConfigDict(extra="allow")

    node: str
    pool: str = ""
    devices: list[str] = Field(description="GPU or MIG UUIDs, exactly what CUDA_VISIBLE_DEVICES gets.")
    gpu_indices: list[int] = []
    slice_start: int | None = None
    by_node: dict[str, list[str]] | None = Field(
        None, description="A job whose devices span nodes (a gang on a fleet): each node's devices.")


class JobView(BaseModel):
    """A job as the service reports it (keys absent from an answer do not apply to the job's state)."""

    model_config = ConfigDict(extra="allow")

    id: str
    state: JobStateName
    user: str | None = None
    priority: int | None = None
    request: RequestView | None = None
    allocation: AllocationView | None = None
    devices: list[str] | None = None
    exit_code: int | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int | None = None
    pid: int | None = None
    log_path: str | None = None
    cancel_requested: bool | None = None
    last_reason: str | None = Field(None, description="Why the job last stopped or was requeued.")
    reason: str | None = Field(None, description="Why a pending job waits (queued), or why it is stopping.")
    position: int | None = Field(None, description="1-based place in the queue of a pending job.")


class CancelResult(BaseModel):
    id: str
    state: str = Field(description="State after the request: cancelled, or still running while it stops.")


class AuditView(BaseModel):
    id: int | None
    time: float
    event: str
    job: str | None
    gpus: list[str]
    policy: str
    model_version: str
    reason: str
    extra: dict[str, Any]


class ReloadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("spec_paths")
    @classmethod
    def _no_nul_paths(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any("\x00" in p for p in v):
            raise ValueError("paths must not contain NUL characters")
        return v

    @field_validator("policy")
    @classmethod
    def _no_nul_policy(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("must not contain NUL characters")
        return v

    spec_paths: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        None, max_length=64, description="Spec files to load instead (paths on the service's machine); "
                                         "default: reload the current ones.")
    policy: str | None = Field(None, min_length=1, max_length=4096,
                               description="Policy to serve (a name from `rlsched policies`, a policy spec or a "
                                           "model URI); default: the spec's.")


class Health(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: str
    version: str


class ErrorBody(BaseModel):
    detail: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
    422: {"model": ErrorBody, "description": "Invalid request; the message names the field."},
}


# --------------------------------------------------------------------------- helpers


def _one_line(text: object, limit: int = 500) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
    else:
        where, rest = "", parts
    name = ""
    for p in rest:
        name += f"[{p}]" if p.isdigit() else (f".{p}" if name else p)
    if not name:
        return "request body" if where == "body" else (where or "request")
    return f"{where} parameter {name}" if where in ("query", "path", "header") else name


def validation_message(errors: list[Any]) -> str:
    """One line naming each invalid field: ``gpus: must be >= 1 (got -2); user: ...``."""
    out: list[str] = []
    for e in errors[:5]:
        typ = str(e.get("type", ""))
        msg = str(e.get("msg", "invalid"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        loc = _loc(tuple(e.get("loc", ())))
        if typ == "json_invalid":
            ctx = e.get("ctx") or {}
            out.append(f"request body is not valid JSON ({ctx.get('error', msg)})")
            continue
        if typ == "missing":
            out.append(f"{loc}: required")
            continue
        if typ == "extra_forbidden":
            out.append(f"{loc}: unknown field")
            continue
        if typ == "model_attributes_type":
            out.append(f"{loc}: expected a JSON object")
            continue
        if typ == "string_pattern_mismatch":
            pattern = str((e.get("ctx") or {}).get("pattern", ""))
            msg = f"invalid value, expected {PATTERN_WORDS.get(pattern, 'a string matching ' + pattern)}"
        got = ""
        if "input" in e and typ not in ("value_error",) and not isinstance(e["input"], dict):
            got = f" (got {_one_line(repr(e['input']), 60)})"
        out.append(f"{loc}: {msg[0].lower() + msg[1:] if msg else msg}{got}")
    if len(errors) > 5:
        out.append(f"and {len(errors) - 5} more")
    return _one_line("; ".join(out) or "invalid request", 1000)


def _admission_status(exc: Exception) -> int:
    """The HTTP status of a refused submission: its ``kind`` (quota 403, conflict 409, else 422)."""
    kind = str(getattr(exc, "kind", "") or "").lower()
    return {"quota": 403, "conflict": 409}.get(kind, 422)


def redact_job(job: dict[str, Any]) -> dict[str, Any]:
    """A job view for an anonymous reader: argv, cwd, environment and idempotency key replaced by
    :data:`REDACTED` (job-supplied strings that may carry secrets), the log path (a path on the service's
    machine) too. Everything the scheduler says about the job (state, user, size, reason, place) is kept."""
    out = dict(job)
    request = out.get("request")
    if isinstance(request, dict):
        request = dict(request)
        if "argv" in request:
            request["argv"] = [REDACTED]
        for name in REDACTED_REQUEST_FIELDS:
            if request.get(name) is not None:
                request[name] = REDACTED
        out["request"] = request
    if out.get("log_path") is not None:
        out["log_path"] = REDACTED
    return out


def redact_info(info: dict[str, Any]) -> dict[str, Any]:
    """``/v1/info`` for an anonymous reader: no state dir or spec paths, the backend's kind without its file."""
    out = dict(info)
    for name in REDACTED_INFO_FIELDS:
        if name in out:
            out[name] = REDACTED
    backend = out.get("backend")
    if isinstance(backend, str) and ":" in backend:
        out["backend"] = backend.split(":", 1)[0] + ":" + REDACTED
    return out


def _tail(path: Path, tail: int | None, offset: int | None, max_bytes: int) -> tuple[bytes, int, int]:
    """(data, start offset, size) of a log file; empty if it does not exist yet."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; size and read must see the same file
    except FileNotFoundError:
        return b"", 0, 0
    with f:
        size = os.fstat(f.fileno()).st_size
        if offset is not None:
            start = min(offset, size)
        elif tail is not None:
            start = max(0, size - tail)
        else:
            start = max(0, size - max_bytes)
        f.seek(start)
        data = f.read(min(max_bytes, size - start))
    return data, start, size


# --------------------------------------------------------------------------- the body limit


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, by Content-Length and by what actually arrives.

    The body is read (up to the limit) before the app sees the request and then
    replayed, so a chunked upload that lies about or omits its length is cut off
    at the limit too.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(send, 400, "invalid Content-Length header")
                    return
                if declared > self.max_bytes:
                    await self._too_large(send)
                    return
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Callable[[Any], Awaitable[None]]) -> None:
        await self._reject(send, 413, f"request body too large (limit {self.max_bytes} bytes)")

    @staticmethod
    async def _reject(send: Callable[[Any], Awaitable[None]], status: int, detail: str) -> None:
        import json

        payload = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


# --------------------------------------------------------------------------- the app


def create_app(service: ServiceLike, token: str, *, max_body_bytes: int = MAX_BODY_BYTES,
               public_read: bool = False) -> FastAPI:
    """The FastAPI application serving ``service``, guarded by ``token``.

    Args:
        service: a started :class:`~rlsched.service.service.SchedulerService` (or
            anything with its methods).
        token: the bearer token every request except health and docs must carry.
        max_body_bytes: larger request bodies get 413.
        public_read: the reads of :data:`PUBLIC_READS` answer without a token, redacted (see the module doc).
    """
    if not token:
        raise ValueError("the API needs a non-empty token")
    from rlsched.runtime.job_request import JobRequest
    from rlsched.runtime.store import IdempotencyConflictError, InvalidTransitionError, UnknownJobError
    from rlsched.service.admission import AdmissionError
    from rlsched.spec.model import SpecError

    app = FastAPI(
        docs_url=None,  # /docs is served below from local assets: FastAPI's default loads them from a CDN
        redoc_url=None,
        title="rlsched scheduler service",
        version=rlsched.__version__,
        description=("Submit jobs to a GPU pool scheduled by rlsched (learned policy with heuristic fallback), "
                     "follow them, and read the audit trail. Authenticate with `Authorization: Bearer <token>`; "
                     "the token is in `<state_dir>/token` (mode 0600) on the service's machine."),
        openapi_tags=TAGS,
    )
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    _mount_docs(app)
    bearer = HTTPBearer(auto_error=False, description="The token in <state_dir>/token.")

    def require_token(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if creds is None:
            raise HTTPException(401, "missing bearer token (send 'Authorization: Bearer <token>'; the token is in "
                                     "the service's state dir, file 'token', or set RLSCHED_TOKEN)",
                                headers={"WWW-Authenticate": 'Bearer realm="rlsched"'})
        if creds.scheme.lower() != "bearer" or not token_matches(token, creds.credentials):
            raise HTTPException(401, "invalid bearer token",
                                headers={"WWW-Authenticate": 'Bearer realm="rlsched", error="invalid_token"'})

    auth = [Depends(require_token)]

    def read_access(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> bool:
        """True for a token holder; False for an anonymous reader (only under ``public_read``); else 401.
        A token that is sent must be right, public read or not."""
        if creds is None and public_read:
            return False
        require_token(creds)
        return True

    # ---------------------------------------------------------------- error handlers
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        return JSONResponse(status_code=422, content={"detail": validation_message(errors),
                                                      "errors": _jsonable_errors(errors)})

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": _one_line(exc.detail)},
                            headers=dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(status_code=500, content={
            "detail": f"internal error ({type(exc).__name__}); the service logged the details"})

    def fail(exc: Exception) -> HTTPException:
        """An HTTPException for a library error raised by the service."""
        if isinstance(exc, UnknownJobError):
            return HTTPException(404, _one_line(exc))
        if isinstance(exc, IdempotencyConflictError):
            return HTTPException(409, _one_line(exc))
        if isinstance(exc, InvalidTransitionError):
            return HTTPException(409, _one_line(exc))
        if isinstance(exc, AdmissionError):
            return HTTPException(_admission_status(exc), _one_line(exc))
        if isinstance(exc, SpecError):
            return HTTPException(422, _one_line(exc))
        return HTTPException(422, _one_line(exc))

    # ---------------------------------------------------------------- endpoints
    @app.get("/healthz", tags=["service"], response_model=Health, summary="Liveness (no token needed)")
    def healthz() -> dict[str, Any]:
        # Nothing here may help a stranger: no state dir, no paths (a client finds the token through the
        # state dir's server.json, never by asking whoever answers on a port). public_read tells the dashboard
        # whether to read without a token (instead of drawing a 401 every poll); anyone can learn it by trying.
        return {"status": "ok", "version": rlsched.__version__, "pid": os.getpid(), "public_read": public_read}

    @app.post("/v1/jobs", tags=["jobs"], status_code=201, response_model=SubmitResult, dependencies=auth,
              summary="Submit a job",
              responses={**_ERRORS, 403: {"model": ErrorBody, "description": "Over a quota."},
                         409: {"model": ErrorBody, "description": "Idempotency key reused for another request."},
                         413: {"model": ErrorBody, "description": "Request body too large."}})
    def submit(body: SubmitBody, idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key", pattern=IDEMPOTENCY_PATTERN,
            description="Retrying with the same key returns the same job instead of a second one.")] = None,
    ) -> dict[str, Any]:
        key = idempotency_key or body.idempotency_key
        req = JobRequest(
            argv=list(body.argv), gpus=body.gpus, mig=body.mig, priority=body.priority, user=body.user,
            preemptible=body.preemptible, deadline=_f(body.deadline), cpus=_f(body.cpus),
            memory_gib=_f(body.memory_gib), pool=body.pool, estimated_duration_s=_f(body.estimated_duration_s),
            idempotency_key=key, cwd=body.cwd)
        try:
            rec = service.submit(req)
        except RlschedError as exc:
            raise fail(exc) from None
        state = rec.state.value if isinstance(rec.state, Enum) else str(rec.state)
        return {"id": rec.id, "state": state, "submitted_at": rec.submitted_at}

    @app.get("/v1/jobs", tags=["jobs"], response_model=list[JobView], response_model_exclude_unset=True,
             responses={**_ERRORS, 200: {"description": "Jobs in submission order. Header X-Rlsched-Next-Before "
                                                        "(when older matching jobs exist): the `before` of the "
                                                        "previous page."}},
             summary="List jobs in submission order (the last `limit`; page back with `before`)")
    def list_jobs(
        response: Response,
        authed: Annotated[bool, Depends(read_access)],
        state: Annotated[list[JobStateName] | None, Query(description="Only jobs in these states (repeatable).")]
        = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="The last N matching jobs.")] = DEFAULT_PAGE,
        before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="Only jobs whose `seq` is below this "
                                                                         "(the X-Rlsched-Next-Before of a page).")]
        = None,
    ) -> list[dict[str, Any]]:
        states = [s.value for s in state] if state else None
        try:
            out = service.jobs(states, limit=limit, before=before)
        except RlschedError as exc:
            raise fail(exc) from None
        if len(out) == limit and out and isinstance(out[0].get("seq"), int):
            response.headers["X-Rlsched-Next-Before"] = str(out[0]["seq"])
        return out if authed else [redact_job(j) for j in out]

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], response_model=JobView, response_model_exclude_unset=True,
             responses={**_ERRORS, 404: {"model": ErrorBody, "description": "No such job."}},
             summary="One job: state, allocation, and why it is pending")
    def get_job(job_id: JobId, authed: Annotated[bool, Depends(read_access)]) -> dict[str, Any]:
        try:
            job = service.job_status(job_id)
        except RlschedError as exc:
            raise fail(exc) from None
        return job if authed else redact_job(job)

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"], response_model=CancelResult, dependencies=auth,
              responses={**_ERRORS, 404: {"model": ErrorBody, "description": "No such job."}},
              summary="Cancel a job (idempotent)")
    def cancel(job_id: JobId) -> dict[str, Any]:
        try:
            state = service.cancel(job_id)
        except RlschedError as exc:
            raise fail(exc) from None
        return {"id": job_id, "state": state.value if isinstance(state, Enum) else str(state)}

    @app.get("/v1/jobs/{job_id}/logs", tags=["jobs"], dependencies=auth, response_class=PlainTextResponse,
             responses={**_ERRORS, 404: {"model": ErrorBody, "description": "No such job."},
                        200: {"content": {"text/plain": {}},
                              "description": "Log bytes. Headers: X-Rlsched-Log-Offset (where the bytes start), "
                                             "X-Rlsched-Log-Next (offset to ask for next), X-Rlsched-Job-State."}},
             summary="The job's output (stdout and stderr)")
    def logs(
        job_id: JobId,
        tail: Annotated[int | None, Query(ge=0, le=MAX_LOG_CHUNK, description="Only the last N bytes.")] = None,
        offset: Annotated[int | None, Query(ge=0, le=MAX_ID, description="Bytes from this offset on (for following).")]
        = None,
    ) -> Response:
        try:
            status = service.job_status(job_id)
            path = service.log_path(job_id)
        except RlschedError as exc:
            raise fail(exc) from None
        data, start, _size = _tail(Path(path), tail, offset, MAX_LOG_CHUNK)
        return Response(content=data, media_type="text/plain; charset=utf-8",
                        headers={"X-Rlsched-Log-Offset": str(start), "X-Rlsched-Log-Next": str(start + len(data)),
                                 "X-Rlsched-Job-State": str(status.get("state", ""))})

    @app.get("/v1/audit", tags=["audit"], response_model=list[AuditView], dependencies=auth, responses=_ERRORS,
             summary="Audit records in order (id cursor)")
    def audit(
        since: Annotated[int | None, Query(ge=0, le=MAX_ID, description="Records after this id (exclusive cursor).")]
        = None,
        since_time: Annotated[float | None, Query(ge=0, allow_inf_nan=False,
                                                  description="Records at or after this Unix time.")] = None,
        job: Annotated[str | None, Query(pattern=JOB_ID_PATTERN, description="Only this job's records.")] = None,
        limit: Annotated[int, Query(ge=1, le=100_000, description="At most this many records.")] = 1000,
    ) -> list[dict[str, Any]]:
        try:
            if since_time is None:
                return [r.to_dict() for r in service.audit(since=since, job=job, limit=limit)]
            out: list[dict[str, Any]] = []
            cursor = since
            page = max(limit, 1000)
            while len(out) < limit:
                recs = service.audit(since=cursor, job=job, limit=page)
                if not recs:
                    break
                out.extend(r.to_dict() for r in recs if r.time >= since_time)
                cursor = recs[-1].id
                if len(recs) < page:
                    break
            return out[:limit]
        except RlschedError as exc:
            raise fail(exc) from None

    @app.get("/v1/info", tags=["service"], responses=_ERRORS,
             summary="Policy, pools, backend and queue of the running service")
    def info(authed: Annotated[bool, Depends(read_access)]) -> dict[str, Any]:
        out = _jsonable(service.info())
        return out if authed else redact_info(out)

    @app.post("/v1/reload", tags=["service"], dependencies=auth,
              responses={**_ERRORS, 413: {"model": ErrorBody, "description": "Request body too large."}},
              summary="Hot-swap spec and/or policy; queued and running jobs are kept")
    def reload(body: ReloadBody | None = None) -> dict[str, Any]:
        paths = [Path(p) for p in body.spec_paths] if body is not None and body.spec_paths else None
        policy = body.policy if body is not None else None
        try:
            return _jsonable(service.reload(paths, policy=policy))
        except RlschedError as exc:
            raise fail(exc) from None
        except (OSError, ValueError) as exc:  # a path the OS refuses (too long, not a file...)
            raise HTTPException(422, _one_line(f"cannot load the spec: {exc}")) from None

    @app.get("/metrics", tags=["service"], dependencies=[Depends(read_access)], response_class=PlainTextResponse,
             responses={**_ERRORS, 200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}},
             summary="Prometheus metrics")
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(content=generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/trace", tags=["audit"], dependencies=auth, response_class=PlainTextResponse,
             responses={**_ERRORS, 200: {"content": {"text/csv": {}},
                                         "description": "Canonical trace CSV (rlsched trace export's format)."}},
             summary="The service's job history as a canonical trace")
    def trace(
        since_s: Annotated[float | None, Query(gt=0, allow_inf_nan=False,
                                               description="Only jobs submitted in the last N seconds.")] = None,
        with_commands: Annotated[bool, Query(description="Also each job's command line and cwd.")] = False,
    ) -> Response:
        try:
            text = service.trace_csv(since_s, with_commands)
        except RlschedError as exc:
            raise fail(exc) from None
        return Response(content=text, media_type="text/csv; charset=utf-8")

    _mount_board(app, service, [Depends(read_access)])
    _mount_ui(app)
    app.state.started_at = time.time()
    return app


# --------------------------------------------------------------------------- dashboard reads and /ui


class SliceView(BaseModel):
    profile: str
    start: int = Field(description="First memory slice (of 8) of the instance.")
    size: int = Field(description="Memory slices the instance occupies.")
    uuid: str
    job: dict[str, Any] | None = Field(None, description="The job on the instance: id, user, state.")


class GpuView(BaseModel):
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    problem: str = Field(description="Why the GPU gets no new work (empty when it does).")
    mig: bool = Field(description="MIG mode is on.")
    slices: list[SliceView]
    jobs: list[dict[str, Any]] = Field(description="Jobs holding the whole GPU.")


class NodeView(BaseModel):
    hostname: str
    pool: str = Field(description="The pool that claims the node (empty: none).")
    kind: str = Field(description="The pool's capacity: onprem, ondemand or spot.")
    status: str = Field(description="ready, cordoned, draining (cordoned with jobs) or unknown (unreachable).")
    reachable: bool
    cordoned: bool
    gpus: list[GpuView]


class FleetView(BaseModel):
    model_config = ConfigDict(extra="allow")

    time: float
    nodes: list[NodeView]
    unassigned: list[str] = Field(description="Inventory nodes no pool claims.")
    held: dict[str, dict[str, int]] = Field(description="Per capacity kind: reachable nodes and GPUs held.")
    audit_last_id: int = Field(description="The newest audit record's id: a `GET /v1/audit?since=` cursor for "
                                           "reading only what comes next.")
    cost: dict[str, Any] = Field(description="usd_per_hour, usd_total since the service started (`since`), and "
                                             "per pool: price per GPU-hour and its source.")


class QuotaUseView(BaseModel):
    name: str
    pool: str
    principal: str
    max_gpus: int | None
    max_slices: dict[str, int]
    max_gpu_hours_per_day: float | None
    used: dict[str, Any] = Field(description="What the principal holds now: gpus, slices per profile, and "
                                             "gpu_hours over the last 24 h.")


class QuotasView(BaseModel):
    quotas: list[QuotaUseView]
    users: dict[str, dict[str, Any]] = Field(description="Per user holding GPUs: jobs, gpus, slices per profile, "
                                                         "pools.")


class DecisionView(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    time: float
    kind: str = Field(description="place, preempt, reconfigure, scale...")
    job: str | None
    policy: str = Field(description="Who decided (primary, fallback, a heuristic name...).")
    model_version: str
    applied: bool
    reason: str = Field(description="Why a refused decision was refused.")
    payload: dict[str, Any]


def _mount_board(app: FastAPI, service: ServiceLike, auth: list[Any]) -> None:
    """``/v1/fleet``, ``/v1/quotas``, ``/v1/decisions`` (see :mod:`rlsched.service.board`), when ``service`` is
    a real scheduler service; its cost and node families join ``/metrics``. ``auth``: the read dependency
    (the token, or nothing under public read: these answers hold no job-supplied strings beyond ids and
    users)."""
    from rlsched.service.board import board_for

    board = board_for(service)
    if board is None:
        return

    @app.get("/v1/fleet", tags=["service"], response_model=FleetView, dependencies=auth, responses=_ERRORS,
             summary="Every node and GPU, MIG instances and the jobs on them; nodes held and cost")
    def fleet() -> dict[str, Any]:
        return board.fleet()

    @app.get("/v1/quotas", tags=["service"], response_model=QuotasView, dependencies=auth, responses=_ERRORS,
             summary="Each quota's limits and use now; what each user holds")
    def quotas() -> dict[str, Any]:
        return _jsonable(board.quotas())

    @app.get("/v1/decisions", tags=["service"], response_model=list[DecisionView], dependencies=auth,
             responses=_ERRORS,
             summary="The scheduler's last decisions (applied or refused), oldest first")
    def decisions(limit: Annotated[int, Query(ge=1, le=500, description="The last N decisions.")] = 50,
                  ) -> list[dict[str, Any]]:
        return _jsonable(board.decisions(limit))


#: The dashboard's Content-Security-Policy: its own script and style only, requests to this origin only.
UI_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: The dashboard's files (package data in rlsched/service/ui) and their media types.
UI_ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
             "app.css": "text/css; charset=utf-8"}


def ui_asset(name: str) -> bytes:
    """One file of the dashboard, read from the installed package."""
    from importlib.resources import files

    return files("rlsched.service").joinpath("ui", name).read_bytes()


def _mount_ui(app: FastAPI) -> None:
    """``/ui``: the live dashboard (static files; it reads the API with the token the user logs in with)."""
    from fastapi.responses import RedirectResponse

    headers = {"Content-Security-Policy": UI_CSP, "X-Content-Type-Options": "nosniff",
               "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=307)

    @app.get("/ui/", include_in_schema=False)
    def ui_index() -> Response:
        return Response(ui_asset("index.html"), media_type=UI_ASSETS["index.html"], headers=headers)

    @app.get("/ui/{name}", include_in_schema=False)
    def ui_file(name: str) -> Response:
        if name not in UI_ASSETS:
            raise HTTPException(404, f"no dashboard file {name!r}")
        return Response(ui_asset(name), media_type=UI_ASSETS[name], headers=headers)


#: Where ``/docs`` loads Swagger UI's script and style from (served by the service itself).
DOCS_ASSETS = "/docs-assets"


def _mount_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from the ``swagger-ui-bundle`` package's files, so it works without internet."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse
    from starlette.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")


def _f(v: float | int | None) -> float | None:
    return None if v is None else float(v)


def _jsonable(obj: Any) -> Any:
    """Paths, enums, tuples and dataclasses of a service dict as JSON values."""
    import dataclasses

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def _jsonable_errors(errors: list[Any]) -> list[dict[str, Any]]:
    out = []
    for e in errors[:20]:
        out.append({"loc": [str(p) for p in e.get("loc", ())], "type": str(e.get("type", "")),
                    "msg": _one_line(e.get("msg", ""), 300)})
    return out

