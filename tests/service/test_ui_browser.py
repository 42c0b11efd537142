"""The dashboard in a real browser (headless system Chromium via Playwright) against ``rlsched serve`` on a
simulated fleet: it loads without console errors, follows a job from queued to running to done, redraws a
MIG re-split, has a cancel without the token refused, shows hostile argv as text, and renders read-only without
a token when the service is started with ``--public-read``."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.serving import Served, http, start_serve, wait_for, write_workspace
from tests.service.ui_harness import open_browser, why_no_browser

MIG_NODE = "gpu-h100-02"
#: How long the page may take to show a change (it polls every 2 s).
SHOW_MS = 15_000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("ui")
    spec, fleet = write_workspace(root)
    svc = start_serve(spec, fleet, root / "state")
    try:
        yield svc
    finally:
        for job in json_list(svc, "/v1/jobs?state=running&state=queued"):
            http("POST", f"{svc.url}/v1/jobs/{job['id']}/cancel", token=svc.token)
        svc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = why_no_browser()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests must run on CI: {why}")
        pytest.skip(why)
    with open_browser() as b:
        yield b


@pytest.fixture
def page(browser: Any, served: Served) -> Iterator[Any]:
    """A logged-in dashboard page; its console errors and page errors are collected in ``page.problems``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.problems = problems
    pg.goto(served.url + "/ui/")
    pg.fill("#token", served.token)
    pg.click("#login-button")
    pg.wait_for_selector("#fleet .node", timeout=SHOW_MS)
    try:
        yield pg
    finally:
        context.close()


def json_list(svc: Served, path: str) -> list[dict[str, Any]]:
    status, _, body = http("GET", svc.url + path, token=svc.token)
    assert status == 200, body
    return list(json.loads(body))


def submit(svc: Served, argv: list[str], **extra: Any) -> str:
    status, _, body = http("POST", svc.url + "/v1/jobs", token=svc.token, body={"argv": argv, **extra})
    assert status == 201, body
    return str(json.loads(body)["id"])


def job_state(svc: Served, job_id: str) -> str:
    status, _, body = http("GET", f"{svc.url}/v1/jobs/{job_id}", token=svc.token)
    assert status == 200, body
    return str(json.loads(body)["state"])


def test_page_loads_with_no_console_errors(page: Any, served: Served) -> None:
    from playwright.sync_api import expect

    nodes = page.locator("#fleet .node")
    expect(nodes).to_have_count(2)
    expect(page.locator(f'[data-node="{MIG_NODE}"] g[data-profile="3g.40gb"]')).to_have_count(2)
    for panel in ("#queue", "#running", "#policy-panel", "#quotas", "#cost", "#audit"):
        expect(page.locator(panel)).to_be_visible()
    expect(page.locator("#policy-panel")).to_contain_text("circuit breaker")
    page.wait_for_timeout(2500)  # one more poll
    assert page.problems == []


def test_a_job_moves_from_queued_to_running_to_done(page: Any, served: Served, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    blocker = submit(served, ["sleep", "60"], gpus=4, user="alice")
    wait_for(lambda: job_state(served, blocker) == "running", what="the blocker to run")
    flag = tmp_path / "finish"  # the job runs until the test has seen it running, however slow the machine
    code = ("import os, sys, time\nprint('hello from the job', flush=True)\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.05)")
    job = submit(served, [sys.executable, "-c", code, str(flag)], gpus=1, user="bob")
    page.goto(f"{served.url}/ui/#/jobs/{job}")
    state = page.locator("#job-state")
    expect(state).to_have_text("queued", timeout=SHOW_MS)
    expect(page.locator("#job-reason")).to_contain_text("waiting for 1 free")
    status, _, body = http("POST", f"{served.url}/v1/jobs/{blocker}/cancel", token=served.token)
    assert status == 200, body
    expect(state).to_have_text("running", timeout=SHOW_MS)
    expect(page.locator("#allocation")).to_contain_text("gpu-h100-01")
    expect(page.locator("#log")).to_contain_text("hello from the job", timeout=SHOW_MS)
    flag.touch()
    expect(state).to_have_text("done", timeout=SHOW_MS)
    expect(page.locator("#job-audit")).to_contain_text("completion")
    assert page.problems == []


def test_a_mig_resplit_is_redrawn(page: Any, served: Served) -> None:
    from playwright.sync_api import expect

    from rlsched.runtime.sim_backend import SimulatedBackend, read_fleet

    data = read_fleet(served.fleet)
    gpu = next(g for n in data["nodes"] if n["hostname"] == MIG_NODE for g in n["gpus"] if g["index"] == 1)
    drawn = page.locator(f'svg[data-gpu="{gpu["uuid"]}"] g.instance')
    expect(drawn).to_have_count(4)
    SimulatedBackend(served.fleet).set_mig_layout(MIG_NODE, gpu["uuid"], {"7g.80gb": 1})
    expect(page.locator(f'svg[data-gpu="{gpu["uuid"]}"] g[data-profile="7g.80gb"]')).to_have_count(1,
                                                                                                  timeout=SHOW_MS)
    expect(drawn).to_have_count(1)
    assert page.problems == []


def test_cancel_without_the_token_is_refused(browser: Any, served: Served) -> None:
    from playwright.sync_api import expect

    job = submit(served, ["sleep", "60"], gpus=1, user="carol")
    wait_for(lambda: job_state(served, job) == "running", what="the job to run")
    context = browser.new_context()  # a fresh session: no token stored
    try:
        pg = context.new_page()
        pg.goto(f"{served.url}/ui/#/jobs/{job}")
        expect(pg.locator("#job-error")).to_contain_text("Log in")
        pg.click("#cancel")
        expect(pg.locator("#cancel-result")).to_contain_text("refused (401)")
        expect(pg.locator("#cancel-result")).to_contain_text("missing bearer token")
        assert pg.evaluate("sessionStorage.length") == 0
    finally:
        context.close()
    assert job_state(served, job) == "running"
    http("POST", f"{served.url}/v1/jobs/{job}/cancel", token=served.token)


def test_hostile_argv_is_rendered_as_text(page: Any, served: Served) -> None:
    from playwright.sync_api import expect

    argv = ["echo", "<script>window.__pwned = 1</script>", "<img src=x onerror=\"window.__pwned = 2\">"]
    job = submit(served, argv, gpus=1, user="mallory")
    wait_for(lambda: job_state(served, job) in ("done", "failed"), what="the job to end")
    page.goto(f"{served.url}/ui/#/jobs/{job}")
    expect(page.locator("#job-argv")).to_have_text(" ".join(argv), timeout=SHOW_MS)
    page.goto(f"{served.url}/ui/#/")
    expect(page.locator("#recent")).to_contain_text("<script>window.__pwned = 1</script>", timeout=SHOW_MS)
    assert page.locator("#main script").count() == 0
    assert page.locator("#main img").count() == 0
    time.sleep(0.5)
    assert page.evaluate("window.__pwned") is None
    assert page.problems == []


def test_ui_assets_need_no_token_but_reads_do(served: Served) -> None:
    status, headers, _ = http("GET", served.url + "/ui/")
    assert status == 200 and "default-src 'self'" in headers["content-security-policy"]
    assert http("GET", served.url + "/v1/fleet")[0] == 401


def test_public_read_renders_read_only_without_logging_in(browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from rlsched.service.api import REDACTED

    spec, fleet = write_workspace(tmp_path)
    svc = start_serve(spec, fleet, tmp_path / "state", "--public-read")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # no token stored
    try:
        job = submit(svc, [sys.executable, "-c", "import time; time.sleep(60)", "--secret=hunter2"], gpus=1,
                     user="dave")
        wait_for(lambda: job_state(svc, job) == "running", what="the job to run")
        pg = context.new_page()
        problems: list[str] = []
        pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        pg.goto(svc.url + "/ui/")
        expect(pg.locator("#fleet .node")).to_have_count(2, timeout=SHOW_MS)
        expect(pg.locator(f'#fleet g[data-job="{job}"]')).to_have_count(1)
        expect(pg.locator("#running")).to_contain_text(job)
        expect(pg.locator("#audit")).to_contain_text("log in to see")
        expect(pg.locator("#banner")).to_contain_text("Read-only")
        expect(pg.locator("#login")).to_be_visible()
        pg.goto(f"{svc.url}/ui/#/jobs/{job}")
        expect(pg.locator("#job-state")).to_have_text("running", timeout=SHOW_MS)
        expect(pg.locator("#job-argv")).to_have_text(REDACTED)
        expect(pg.locator("#cancel")).to_be_disabled()
        expect(pg.locator("#cancel-note")).to_have_text("log in to cancel")
        expect(pg.locator("#logs")).to_contain_text("log in to see")
        expect(pg.locator("#job-audit")).to_contain_text("log in to see")
        assert "hunter2" not in pg.content()
        assert pg.evaluate("sessionStorage.length") == 0
        assert problems == []
        assert job_state(svc, job) == "running"
    finally:
        context.close()
        for j in json_list(svc, "/v1/jobs?state=running&state=queued"):
            http("POST", f"{svc.url}/v1/jobs/{j['id']}/cancel", token=svc.token)
        svc.stop()
