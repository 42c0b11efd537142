"""The dashboard's reads (fleet, quotas, decisions, cost) and its static files: what they contain, how they are
served (CSP, no token for the files, the token for the data) and that they ship with the package."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest
import tomllib

from rlsched.cluster.catalog import CATALOG
from rlsched.cluster.model import PoolKind, PoolSpec
from rlsched.runtime.job_request import JobRequest
from rlsched.service.api import UI_ASSETS, UI_CSP
from rlsched.service.board import CostMeter, board_for, node_status, pool_price
from rlsched.service.service import SchedulerService
from tests.service import kill_jobs, service, sleeper, until
from tests.service.serving import Served, http, start_serve, write_workspace

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- the files


def test_assets_are_package_data_found_through_importlib_resources() -> None:
    ui = files("rlsched.service").joinpath("ui")
    for name in UI_ASSETS:
        assert ui.joinpath(name).read_bytes(), name
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["rlsched"]
    for name in UI_ASSETS:
        assert any(fnmatch.fnmatch(f"service/ui/{name}", p) for p in patterns), f"{name} is not package data"


def test_page_has_no_inline_script_or_style_and_the_script_never_parses_html() -> None:
    ui = files("rlsched.service").joinpath("ui")
    html = ui.joinpath("index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert "<style" not in html and not re.search(r"\sstyle=", html)
    assert not re.search(r"\son[a-z]+=", html)
    assert not re.search(r"https?://", html)
    js = ui.joinpath("app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, sink
    assert "localStorage" not in js and "sessionStorage" in js  # the token lives only as long as the tab
    assert "?token" not in js and "&token" not in js  # never in a URL


# ---------------------------------------------------------------------- pure parts


def _pool(kind: PoolKind, cost: float | None = None) -> PoolSpec:
    return PoolSpec("p", kind, CATALOG["H100-80GB"], 8, 1, 1, cost_per_gpu_hour=cost)


def test_pool_price_follows_the_market_rule() -> None:
    assert pool_price(_pool(PoolKind.ONPREM)) == (0.0, "on-prem")
    assert pool_price(_pool(PoolKind.ONPREM, 1.25)) == (1.25, "pool")
    spot, src = pool_price(_pool(PoolKind.SPOT))
    ondemand, _ = pool_price(_pool(PoolKind.ONDEMAND))
    assert src == "market-mean" and 0 < spot < ondemand


def test_cost_meter_integrates_the_rate_between_reads() -> None:
    meter = CostMeter(started=0.0)
    assert meter.sample(3600.0, 10.0) == pytest.approx(10.0)  # the first read covers the time since start
    assert meter.sample(7200.0, 4.0) == pytest.approx(20.0)  # the previous rate held until now
    assert meter.sample(9000.0, 4.0) == pytest.approx(22.0)
    assert meter.sample(8000.0, 4.0) == pytest.approx(22.0)  # a clock step back adds nothing


def test_node_status_words() -> None:
    from rlsched.runtime.backend import NodeInfo

    assert node_status(NodeInfo("a"), False) == "ready"
    assert node_status(NodeInfo("a", reachable=False), True) == "unknown"
    assert node_status(NodeInfo("a", cordoned=True), True) == "draining"
    assert node_status(NodeInfo("a", cordoned=True), False) == "cordoned"


# ---------------------------------------------------------------------- a live service


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[SchedulerService]:
    with service(tmp_path) as s:
        yield s


def test_fleet_shows_mig_instances_and_the_jobs_on_them(svc: SchedulerService) -> None:
    board = board_for(svc)
    assert board is not None and board_for(svc) is board  # one board (and one collector) per service
    whole = svc.submit(JobRequest(sleeper(), gpus=2, user="team-a"))
    mig = svc.submit(JobRequest(sleeper(), mig="1g.10gb", user="group:interns"))
    until(svc, lambda: svc.job_status(whole.id)["state"] == "running" and svc.job_status(mig.id)["state"] == "running")
    try:
        fleet = board.fleet()
        nodes = {n["hostname"]: n for n in fleet["nodes"]}
        assert set(nodes) == {"gpu-a100-01", "gpu-h100-01"}
        a100 = nodes["gpu-a100-01"]
        assert a100["pool"] == "onprem" and a100["status"] == "ready" and len(a100["gpus"]) == 4
        assert sum(1 for g in a100["gpus"] if g["jobs"] and g["jobs"][0]["id"] == whole.id) == 2
        h100 = nodes["gpu-h100-01"]
        slices = [s for g in h100["gpus"] for s in g["slices"]]
        assert sorted((s["profile"], s["size"]) for s in h100["gpus"][0]["slices"]) == [
            ("1g.10gb", 1), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
        held = [s for s in slices if s["job"] is not None]
        assert [(s["profile"], s["job"]["id"], s["job"]["user"]) for s in held] == [
            ("1g.10gb", mig.id, "group:interns")]
        assert fleet["held"] == {"onprem": {"nodes": 2, "gpus": 6}}
        assert fleet["cost"]["usd_per_hour"] == 0.0  # on-prem pools cost nothing unless priced
        assert fleet["audit_last_id"] == svc.store.last_audit_id() > 0

        quotas = board.quotas()
        by_name = {q["name"]: q for q in quotas["quotas"]}
        assert by_name["team_a"]["used"]["gpus"] == 2 and by_name["team_a"]["max_gpus"] == 2
        assert by_name["interns"]["used"]["slices"] == {"1g.10gb": 1}
        assert quotas["users"]["team-a"] == {"jobs": 1, "gpus": 2, "slices": {}, "pools": ["onprem"]}

        decisions = board.decisions(5)
        assert {d["job"] for d in decisions if d["kind"] == "place"} >= {whole.id, mig.id}
        assert len(board.decisions(1)) == 1 and board.decisions(1)[0]["id"] == decisions[-1]["id"]

        names = {m.name for m in svc.registry.collect()}
        assert {"rlsched_cost_rate_usd_per_hour", "rlsched_cost_usd", "rlsched_nodes_held",
                "rlsched_job_wait_seconds"} <= names
        waits = [s for m in svc.registry.collect() if m.name == "rlsched_job_wait_seconds" for s in m.samples
                 if s.name == "rlsched_job_wait_seconds_count"]
        assert waits[0].value == 2
    finally:
        kill_jobs(svc)


def test_a_cordoned_node_with_jobs_is_draining(svc: SchedulerService, tmp_path: Path) -> None:
    from rlsched.runtime.sim_backend import SimulatedBackend

    board = board_for(svc)
    assert board is not None
    job = svc.submit(JobRequest(sleeper(), gpus=1))
    until(svc, lambda: svc.job_status(job.id)["state"] == "running")
    try:
        SimulatedBackend(tmp_path / "fleet.json").cordon("gpu-a100-01", True)
        svc.tick()
        nodes = {n["hostname"]: n for n in board.fleet()["nodes"]}
        assert nodes["gpu-a100-01"]["status"] == "draining" and nodes["gpu-h100-01"]["status"] == "ready"
    finally:
        kill_jobs(svc)


# ---------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("ui-http")
    spec, fleet = write_workspace(root)
    s = start_serve(spec, fleet, root / "state")
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]
    assert "Traceback" not in s.log_text(), s.log_text()[-5000:]


def test_ui_files_are_served_with_a_strict_csp_and_no_token(served: Served) -> None:
    status, headers, _ = http("GET", served.url + "/ui", headers={})
    assert status == 200  # urllib follows the redirect to /ui/
    for name, media in UI_ASSETS.items():
        status, headers, body = http("GET", f"{served.url}/ui/{name}")
        assert status == 200 and headers["content-type"] == media and body
        assert headers["content-security-policy"] == UI_CSP
        assert headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in UI_CSP and "unsafe" not in UI_CSP
    status, _, body = http("GET", served.url + "/ui/..%2Fapi.py")
    assert status == 404


def test_dashboard_reads_need_the_token_and_are_in_the_openapi(served: Served) -> None:
    for path in ("/v1/fleet", "/v1/quotas", "/v1/decisions"):
        assert http("GET", served.url + path)[0] == 401, path
        status, _, body = http("GET", served.url + path, token=served.token)
        assert status == 200, body
    status, _, body = http("GET", served.url + "/openapi.json")
    paths = json.loads(body)["paths"]
    assert {"/v1/fleet", "/v1/quotas", "/v1/decisions"} <= set(paths)
    assert not any(p.startswith("/ui") for p in paths)
    schemas = {p: json.dumps(paths[p]["get"]["responses"]["200"]["content"]["application/json"]["schema"])
               for p in ("/v1/fleet", "/v1/quotas", "/v1/decisions")}
    assert "FleetView" in schemas["/v1/fleet"] and "QuotasView" in schemas["/v1/quotas"]
    assert "DecisionView" in schemas["/v1/decisions"]
    assert http("GET", served.url + "/v1/decisions?limit=0", token=served.token)[0] == 422
