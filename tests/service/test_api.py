"""The HTTP API of ``rlsched serve``: a real uvicorn server in a subprocess, real HTTP requests."""

from __future__ import annotations

import json
import os
import stat
import sys
import urllib.parse
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path

import pytest

from .serving import Served, detail, http, start_serve, wait_for, write_workspace


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("api")
    spec, fleet = write_workspace(root)
    s = start_serve(spec, fleet, root / "state")
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]
    assert not (s.state_dir / "server.json").exists()
    assert "Traceback" not in s.log_text(), s.log_text()[-5000:]


def submit(s: Served, body: dict[str, object], **headers: str) -> tuple[int, dict[str, str], bytes]:
    return http("POST", s.url + "/v1/jobs", token=s.token, body=body, headers=headers)


def test_token_file_is_private_and_required(served: Served) -> None:
    mode = stat.S_IMODE(os.stat(served.state_dir / "token").st_mode)
    assert mode == 0o600
    status, _, body = http("GET", served.url + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    for path in ("/v1/jobs", "/v1/info", "/v1/audit", "/metrics"):
        status, headers, body = http("GET", served.url + path)
        assert status == 401, path
        assert headers["www-authenticate"].startswith("Bearer")
        assert "missing bearer token" in detail(body)
        status, headers, body = http("GET", served.url + path, token="not-the-token")
        assert status == 401 and detail(body) == "invalid bearer token"
        assert 'error="invalid_token"' in headers["www-authenticate"]
    status, _, _ = http("POST", served.url + "/v1/jobs", body={"argv": ["true"]})
    assert status == 401
    status, _, _ = http("GET", served.url + "/v1/jobs", headers={"Authorization": f"Basic {served.token}"})
    assert status == 401
    status, _, body = http("GET", served.url + "/v1/jobs", token=served.token)
    assert status == 200 and isinstance(json.loads(body), list)


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"argv": ["true"], "gpus": "two"}, "gpus", "valid integer"),
    ({"argv": ["true"], "gpus": "2"}, "gpus", "valid integer"),
    ({"argv": ["true"], "gpus": -1}, "gpus", "greater than or equal to 1"),
    ({"argv": ["true"], "gpus": 0}, "gpus", "greater than or equal to 1"),
    ({"argv": ["true"], "gpus": 100000}, "gpus", "less than or equal to"),
    ({"argv": ["true"], "gpus": 1.5}, "gpus", "valid integer"),
    ({"argv": ["true"], "mig": "5g.33gb"}, "mig", "unknown MIG profile '5g.33gb'"),
    ({"argv": ["true"], "mig": "big"}, "mig", "unknown MIG profile 'big'"),
    ({"argv": ["true"], "mig": "3g.40gb", "gpus": 2}, "", "either gpus or mig"),
    ({"argv": []}, "argv", "at least 1 item"),
    ({"argv": "sleep 10"}, "argv", "valid list"),
    ({"argv": ["", "x"]}, "argv", "argv[0]"),
    ({"argv": ["true", 3]}, "argv[1]", "valid string"),
    ({}, "argv", "required"),
    ({"argv": ["true"], "priority": 10**9}, "priority", "less than or equal to 1000"),
    ({"argv": ["true"], "priority": "high"}, "priority", "valid integer"),
    ({"argv": ["true"], "user": "robert'); DROP TABLE jobs;--"}, "user", "invalid value, expected 1-64 letters"),
    ({"argv": ["true"], "preemptible": "yes"}, "preemptible", "valid boolean"),
    ({"argv": ["true"], "deadline": -5}, "deadline", "greater than 0"),
    ({"argv": ["true"], "cpus": -2}, "cpus", "greater than 0"),
    ({"argv": ["true"], "colour": "blue"}, "colour", "unknown field"),
])
def test_bad_submissions_get_422_naming_the_field(served: Served, body: dict[str, object], field: str,
                                                  words: str) -> None:
    status, _, raw = submit(served, body)
    assert status == 422, raw
    msg = detail(raw)
    assert "\n" not in msg and words in msg, msg
    if field:
        assert msg.startswith(f"{field}:") or f"{field}: " in msg, msg


def test_non_json_and_non_object_bodies_get_422(served: Served) -> None:
    status, _, raw = http("POST", served.url + "/v1/jobs", token=served.token, raw=b"{not json")
    assert status == 422 and "not valid JSON" in detail(raw)
    status, _, raw = http("POST", served.url + "/v1/jobs", token=served.token, body=["true"])
    assert status == 422 and "expected a JSON object" in detail(raw)


def test_bad_query_and_path_parameters_get_422_or_404(served: Served) -> None:
    status, _, raw = http("GET", served.url + "/v1/jobs?state=sleeping", token=served.token)
    assert status == 422 and "query parameter state[0]" in detail(raw)
    status, _, raw = http("GET", served.url + "/v1/audit?limit=-1", token=served.token)
    assert status == 422 and "query parameter limit" in detail(raw)
    status, _, raw = http("GET", served.url + "/v1/jobs/j-doesnotexist", token=served.token)
    assert status == 404 and "j-doesnotexist" in detail(raw)
    status, _, raw = http("POST", served.url + "/v1/jobs/j-doesnotexist/cancel", token=served.token)
    assert status == 404
    status, _, raw = http("GET", served.url + "/v1/jobs/" + urllib.parse.quote("a b;c", safe=""), token=served.token)
    assert status == 422 and "path parameter job_id" in detail(raw)


def test_huge_payloads_get_413(served: Served) -> None:
    big = {"argv": ["echo", "x" * 8000] * 20}  # ~160 KiB > the 64 KiB limit
    status, _, raw = submit(served, big)
    assert status == 413 and "too large" in detail(raw)
    # Chunked upload without Content-Length: cut off by what arrives, not by the header.
    u = urllib.parse.urlsplit(served.url)
    conn = HTTPConnection(u.hostname, u.port, timeout=120)
    try:
        conn.putrequest("POST", "/v1/jobs")
        conn.putheader("Authorization", f"Bearer {served.token}")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        chunk = b"[" + b'"x",' * 8000
        for _ in range(3):
            conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        assert resp.status == 413 and b"too large" in resp.read()
    finally:
        conn.close()
    # A huge argument list within the limit is refused by its own constraint.
    status, _, raw = submit(served, {"argv": ["true"] * 2000})
    assert status == 422 and "argv" in detail(raw)


def test_submit_idempotency_status_cancel_logs_audit(served: Served) -> None:
    body = {"argv": [sys.executable, "-c", "print('hello from the job', flush=True); import time; time.sleep(60)"],
            "gpus": 1, "user": "alice", "priority": 3}
    status, _, raw = submit(served, body, **{"Idempotency-Key": "retry-1"})
    assert status == 201, raw
    job = json.loads(raw)["id"]
    status, _, raw = submit(served, body, **{"Idempotency-Key": "retry-1"})
    assert status == 201 and json.loads(raw)["id"] == job  # a retry is the same job
    status, _, raw = submit(served, {**body, "priority": 4}, **{"Idempotency-Key": "retry-1"})
    assert status == 409 and "retry-1" in detail(raw)

    def running() -> bool:
        st, _, r = http("GET", f"{served.url}/v1/jobs/{job}", token=served.token)
        return st == 200 and json.loads(r)["state"] == "running"

    wait_for(running, what="the job to run")
    st, _, r = http("GET", f"{served.url}/v1/jobs/{job}", token=served.token)
    view = json.loads(r)
    assert view["id"] == job and view["user"] == "alice" and view["request"]["argv"] == body["argv"]

    def logged() -> bool:
        st, headers, r = http("GET", f"{served.url}/v1/jobs/{job}/logs", token=served.token)
        assert st == 200 and headers["content-type"].startswith("text/plain")
        return b"hello from the job" in r

    wait_for(logged, what="the job's output")
    st, headers, r = http("GET", f"{served.url}/v1/jobs/{job}/logs?tail=6", token=served.token)
    assert st == 200 and 0 < len(r) <= 6 and int(headers["x-rlsched-log-offset"]) > 0
    st, _, r = http("POST", f"{served.url}/v1/jobs/{job}/cancel", token=served.token)
    assert st == 200 and json.loads(r)["id"] == job

    def cancelled() -> bool:
        _st, _, r = http("GET", f"{served.url}/v1/jobs/{job}", token=served.token)
        return json.loads(r)["state"] == "cancelled"

    wait_for(cancelled, what="the cancel to complete")
    st, _, r = http("GET", f"{served.url}/v1/audit?job={job}", token=served.token)
    events = [a["event"] for a in json.loads(r)]
    assert events[0] == "submission" and "allocation" in events and "cancel" in events
    first = json.loads(r)[0]["id"]
    st, _, r = http("GET", f"{served.url}/v1/audit?job={job}&since={first}&limit=1", token=served.token)
    assert [a["id"] for a in json.loads(r)] == [json.loads(r)[0]["id"]] and json.loads(r)[0]["id"] > first
    st, _, r = http("GET", f"{served.url}/v1/jobs?state=cancelled", token=served.token)
    assert job in [j["id"] for j in json.loads(r)]


def test_quota_refusal_is_403(served: Served) -> None:
    status, _, raw = submit(served, {"argv": ["true"], "gpus": 3, "user": "intern", "pool": "train"})
    assert status == 403, raw
    assert "quota" in detail(raw).lower() and "interns" in detail(raw)


def test_mig_submission_runs_on_a_mig_uuid(served: Served) -> None:
    show = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    status, _, raw = submit(served, {"argv": [sys.executable, "-c", show], "mig": "1g.10gb"})
    assert status == 201, raw
    job = json.loads(raw)["id"]

    def done() -> dict[str, object] | None:
        _st, _, r = http("GET", f"{served.url}/v1/jobs/{job}", token=served.token)
        v = json.loads(r)
        return v if v["state"] in ("done", "failed") else None

    view = wait_for(done, what="the MIG job")
    assert view["state"] == "done", view
    _, _, out = http("GET", f"{served.url}/v1/jobs/{job}/logs", token=served.token)
    seen = out.decode().strip().splitlines()[-1]
    assert seen.startswith("MIG-") and seen in view["devices"], out  # type: ignore[operator]


def test_openapi_describes_the_api(served: Served) -> None:
    status, _, raw = http("GET", served.url + "/openapi.json")
    assert status == 200
    doc = json.loads(raw)
    assert doc["info"]["title"] == "rlsched scheduler service"
    paths = doc["paths"]
    for p, method in [("/v1/jobs", "post"), ("/v1/jobs", "get"), ("/v1/jobs/{job_id}", "get"),
                      ("/v1/jobs/{job_id}/cancel", "post"), ("/v1/jobs/{job_id}/logs", "get"), ("/v1/audit", "get"),
                      ("/v1/info", "get"), ("/v1/reload", "post"), ("/metrics", "get"), ("/healthz", "get")]:
        assert method in paths[p], (p, method)
    post = paths["/v1/jobs"]["post"]
    assert {"201", "401", "403", "409", "413", "422"} <= set(post["responses"])
    assert any(p["name"] == "Idempotency-Key" for p in post["parameters"])
    body = doc["components"]["schemas"]["SubmitBody"]
    assert body["required"] == ["argv"]
    gpus = next(s for s in body["properties"]["gpus"]["anyOf"] if s.get("type") == "integer")
    assert gpus["minimum"] == 1
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert {t["name"] for t in doc["tags"]} == {"jobs", "audit", "service"}


def test_metrics_and_info(served: Served) -> None:
    status, headers, raw = http("GET", served.url + "/metrics", token=served.token)
    from prometheus_client import CONTENT_TYPE_LATEST

    assert status == 200 and headers["content-type"] == CONTENT_TYPE_LATEST
    text = raw.decode()
    assert "# TYPE" in text and "rlsched_" in text
    status, _, raw = http("GET", served.url + "/v1/info", token=served.token)
    assert status == 200 and isinstance(json.loads(raw), dict)


def test_reload_keeps_the_service_and_refuses_a_bad_spec(served: Served, tmp_path: Path) -> None:
    bad = tmp_path / "bad.hcl"
    bad.write_text('pool "x" { gpu_model = "H100-80GB" nodes = [ }\n')
    status, _, raw = http("POST", served.url + "/v1/reload", token=served.token, body={"spec_paths": [str(bad)]})
    assert status == 422 and "bad.hcl" in detail(raw) and "\n" not in detail(raw)
    status, _, raw = http("POST", served.url + "/v1/reload", token=served.token, body={"colour": 1})
    assert status == 422 and "colour: unknown field" in detail(raw)
    status, _, raw = http("POST", served.url + "/v1/reload", token=served.token, body={})
    assert status == 200, raw
    status, _, _ = http("GET", served.url + "/healthz")
    assert status == 200


@pytest.mark.parametrize(("raw", "field"), [
    (b'{"argv": ["true"], "deadline": Infinity}', "deadline"),
    (b'{"argv": ["true"], "deadline": -Infinity}', "deadline"),
    (b'{"argv": ["true"], "deadline": NaN}', "deadline"),
    (b'{"argv": ["true"], "deadline": 1e400}', "deadline"),
    (b'{"argv": ["true"], "cpus": Infinity}', "cpus"),
    (b'{"argv": ["true"], "memory_gib": NaN}', "memory_gib"),
    (b'{"argv": ["true"], "estimated_duration_s": Infinity}', "estimated_duration_s"),
])
def test_non_finite_numbers_get_422_naming_the_field(served: Served, raw: bytes, field: str) -> None:
    status, _, body = http("POST", served.url + "/v1/jobs", token=served.token, raw=raw)
    assert status == 422, body
    msg = detail(body)
    assert msg.startswith(f"{field}:") and "\n" not in msg, msg


def test_out_of_range_cursors_and_bad_reload_paths_are_4xx_one_line(served: Served) -> None:
    for query in (f"since={2**63}", f"since={10**30}", "since_time=inf", "since_time=nan"):
        status, _, raw = http("GET", f"{served.url}/v1/audit?{query}", token=served.token)
        assert status == 422, (query, raw)
        assert "query parameter since" in detail(raw), raw
    status, _, raw = http("GET", f"{served.url}/v1/audit?since={2**63 - 1}", token=served.token)
    assert status == 200 and json.loads(raw) == []
    for body in ({"spec_paths": ["/tmp/a\x00b.hcl"]}, {"policy": "fifo\x00"}, {"spec_paths": ["/" + "x" * 4000]}):
        status, _, raw = http("POST", served.url + "/v1/reload", token=served.token, body=body)
        assert 400 <= status < 500, (body, status, raw)
        msg = detail(raw)
        assert "\n" not in msg, msg
    status, _, raw = http("POST", served.url + "/v1/reload", token=served.token, body={"spec_paths": ["a\x00b"]})
    assert status == 422 and "spec_paths" in detail(raw) and "NUL" in detail(raw)


def test_an_unparseable_content_length_gets_400_in_the_api_shape(served: Served) -> None:
    import socket

    u = urllib.parse.urlsplit(served.url)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=120) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: abc\r\n\r\n{}")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), data
    assert b"content-type: application/json" in head.lower(), head
    assert "Content-Length" in json.loads(body)["detail"]


def test_keep_alive_responses_are_not_delayed_by_nagle() -> None:
    """The listening socket is TCP (proto set), so the event loop sets TCP_NODELAY on every accepted socket."""
    import asyncio
    import socket

    from rlsched.service.daemon import bind

    listener = bind("127.0.0.1", 0)
    seen: list[int] = []

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=listener)
        port = listener.getsockname()[1]
        _, w = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2000):
            if seen:
                break
            await asyncio.sleep(0.01)
        w.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_job_listing_pages_back(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = []
    for _ in range(9):
        status, _, raw = submit(served, {"argv": ["true"], "gpus": 1, "mig": None, "pool": "train",
                                         "user": "pager"})
        assert status == 201, raw
        ids.append(json.loads(raw)["id"])
    status, _, raw = http("GET", served.url + "/v1/jobs?limit=100000", token=served.token)
    assert status == 422 and "query parameter limit" in detail(raw)
    status, headers, raw = http("GET", served.url + "/v1/jobs?limit=4", token=served.token)
    page = json.loads(raw)
    assert status == 200 and [j["id"] for j in page] == ids[-4:]
    assert headers["x-rlsched-next-before"] == str(page[0]["seq"])
    status, headers, raw = http("GET", f"{served.url}/v1/jobs?limit=4&before={page[0]['seq']}", token=served.token)
    assert [j["id"] for j in json.loads(raw)] == ids[-8:-4]
    # the client pages through everything when asked for every job
    from rlsched.service import client as client_mod

    monkeypatch.setattr(client_mod, "JOBS_PAGE", 2)
    c = client_mod.Client(served.url, served.token)
    everything = [j["id"] for j in c.jobs()]
    assert everything[-9:] == ids and len(everything) == len(set(everything))
    assert [j["id"] for j in c.jobs(limit=3)] == ids[-3:]


def test_docs_work_without_internet(served: Served) -> None:
    import re

    status, headers, raw = http("GET", served.url + "/docs")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = raw.decode()
    assert "http://" not in page and "https://" not in page, page  # nothing from a CDN
    assets = re.findall(r"""(?:src|href)=['"](/[^'"]+)['"]""", page)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets) and any(a.endswith(".css") for a in assets)
    for asset in assets:
        status, _, body = http("GET", served.url + asset)
        assert status == 200 and len(body) > 100, asset
    assert "/openapi.json" in page
    status, _, _ = http("GET", served.url + "/redoc")
    assert status == 404


def test_mode_flags_reach_the_service(tmp_path: Path) -> None:
    spec, fleet = write_workspace(tmp_path)
    s = start_serve(spec, fleet, tmp_path / "state", "--shadow")
    try:
        status, _, body = http("GET", s.url + "/v1/info", token=s.token)
        assert status == 200 and json.loads(body)["mode"] == "shadow"
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]
    with pytest.raises(AssertionError, match="exclude each other"):
        start_serve(spec, fleet, tmp_path / "state", "--shadow", "--fallback-only", log_name="both.log")


# ---------------------------------------------------------------------- public read (--public-read)

#: The reads --public-read opens, as concrete paths (the job path's id filled in by the tests).
OPEN_READS = ("/v1/fleet", "/v1/quotas", "/v1/decisions?limit=5", "/v1/jobs", "/v1/jobs/{job}", "/v1/info",
              "/metrics")


def test_without_public_read_every_dashboard_read_needs_the_token(served: Served) -> None:
    status, _, raw = submit(served, {"argv": ["true"], "gpus": 1})
    job = json.loads(raw)["id"]
    for path in OPEN_READS:
        status, _, body = http("GET", served.url + path.format(job=job))
        assert status == 401 and "missing bearer token" in detail(body), path
    assert json.loads(http("GET", served.url + "/healthz")[2])["public_read"] is False  # the page asks no further


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("public")
    spec, fleet = write_workspace(root)
    s = start_serve(spec, fleet, root / "state", "--public-read")
    yield s
    for job in json.loads(http("GET", s.url + "/v1/jobs?state=running&state=queued", token=s.token)[2]):
        http("POST", f"{s.url}/v1/jobs/{job['id']}/cancel", token=s.token)
    assert s.stop() == 0, s.log_text()[-3000:]
    assert "Traceback" not in s.log_text(), s.log_text()[-5000:]


def test_public_read_answers_the_listed_reads_redacted(public: Served, tmp_path: Path) -> None:
    from rlsched.service.api import PUBLIC_READS, REDACTED

    assert len(PUBLIC_READS) == len(OPEN_READS)
    assert json.loads(http("GET", public.url + "/healthz")[2])["public_read"] is True
    secret = "--password=hunter2"
    argv = [sys.executable, "-c", "import time; time.sleep(60)", secret]
    status, _, raw = submit(public, {"argv": argv, "gpus": 1, "user": "alice", "cwd": str(tmp_path)},
                            **{"Idempotency-Key": "key-hunter2"})
    assert status == 201, raw
    job = json.loads(raw)["id"]
    wait_for(lambda: json.loads(http("GET", f"{public.url}/v1/jobs/{job}")[2])["state"] == "running",
             what="the job to run")
    for path in OPEN_READS:
        status, _, body = http("GET", public.url + path.format(job=job))
        assert status == 200, (path, body)
        for hidden in (b"hunter2", str(tmp_path).encode(), str(public.state_dir).encode()):
            assert hidden not in body, (path, hidden)
    view = json.loads(http("GET", f"{public.url}/v1/jobs/{job}")[2])
    assert view["state"] == "running" and view["user"] == "alice" and view["request"]["gpus"] == 1
    assert view["request"]["argv"] == [REDACTED] and view["request"]["cwd"] == REDACTED
    assert view["request"]["idempotency_key"] == REDACTED and view["log_path"] == REDACTED
    listed = {j["id"]: j for j in json.loads(http("GET", public.url + "/v1/jobs")[2])}
    assert listed[job]["request"]["argv"] == [REDACTED]
    info = json.loads(http("GET", public.url + "/v1/info")[2])
    assert info["state_dir"] == REDACTED and info["spec"] == REDACTED and info["backend"] == "sim:" + REDACTED
    assert info["policy"] == "default" and info["running"] >= 1
    fleet = json.loads(http("GET", public.url + "/v1/fleet")[2])
    assert job in json.dumps(fleet)  # the fleet shows the job on its GPU

    # a token holder still reads everything
    view = json.loads(http("GET", f"{public.url}/v1/jobs/{job}", token=public.token)[2])
    assert view["request"]["argv"][-1] == secret and view["request"]["cwd"] == str(tmp_path)
    info = json.loads(http("GET", public.url + "/v1/info", token=public.token)[2])
    assert info["state_dir"] == str(public.state_dir)


def test_public_read_keeps_logs_audit_trace_and_changes_behind_the_token(public: Served) -> None:
    status, _, raw = submit(public, {"argv": ["sleep", "60"], "gpus": 1})
    job = json.loads(raw)["id"]
    for method, path, body in (("GET", f"/v1/jobs/{job}/logs", None), ("GET", "/v1/audit", None),
                               ("GET", f"/v1/audit?job={job}", None), ("GET", "/v1/trace", None),
                               ("GET", "/v1/trace?with_commands=true", None),
                               ("POST", "/v1/jobs", {"argv": ["true"]}), ("POST", f"/v1/jobs/{job}/cancel", None),
                               ("POST", "/v1/reload", {})):
        status, _, answer = http(method, public.url + path, body=body)
        assert status == 401 and "missing bearer token" in detail(answer), (method, path)
    assert json.loads(http("GET", f"{public.url}/v1/jobs/{job}")[2])["state"] in ("queued", "running")
    for path in OPEN_READS:  # a wrong token is refused, never read as anonymous
        status, _, answer = http("GET", public.url + path.format(job=job), token="not-the-token")
        assert status == 401 and detail(answer) == "invalid bearer token", path
    assert http("POST", f"{public.url}/v1/jobs/{job}/cancel", token=public.token)[0] == 200


def test_public_read_passes_through_a_detached_start() -> None:
    from rlsched.service.config import ServiceConfig
    from rlsched.service.daemon import serve_argv

    config = ServiceConfig(spec_paths=[Path("pool.hcl")], state_dir=Path("state"))
    assert config.public_read is False and "--public-read" not in serve_argv(config, "127.0.0.1:0")
    config = ServiceConfig(spec_paths=[Path("pool.hcl")], state_dir=Path("state"), public_read=True)
    assert "--public-read" in serve_argv(config, "127.0.0.1:0")


def test_apply_passes_public_read_to_the_service_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlsched.cli import plan_cmd
    from rlsched.service import daemon
    from rlsched.service.config import ServiceConfig

    spec_path, _fleet = write_workspace(tmp_path)
    spec = plan_cmd._load_spec([spec_path], None, None)
    started: list[ServiceConfig] = []

    def start_detached(config: ServiceConfig, listen: str) -> daemon.ServerInfo:
        started.append(config)
        return daemon.ServerInfo(pid=1, url="http://127.0.0.1:1", started_at=0.0, state_dir=str(config.state_dir))

    monkeypatch.setattr(daemon, "find_running", lambda sd: None)
    monkeypatch.setattr(daemon, "start_detached", start_detached)
    for flag in (False, True):
        plan_cmd._ensure_service(spec, [spec_path], None, tmp_path / "state", "127.0.0.1:0", public_read=flag)
    assert [c.public_read for c in started] == [False, True]
