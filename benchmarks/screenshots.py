"""Screenshots of the dashboard's main views and of a ``simulate --html`` report, for the README.

Starts ``rlsched serve`` on a simulated fleet (the browser tests' workspace: one node of 4 whole H100s, one
node of 2 H100s split by MIG; the whole-GPU pool priced at $2.50 per GPU-hour), fills it - whole-GPU and MIG
jobs running, jobs queued behind them, a quota in use, a finished job whose argv holds ``<script>`` - and
drives Debian's chromium through Playwright (``tests/service/ui_harness.py``) to write, into
``docs/screenshots/`` (``--out``):

* ``login.png`` - the page before logging in;
* ``overview.png`` - fleet with MIG layouts and jobs, queue, running jobs, policy, quotas, cost, audit;
* ``job.png`` - a running job: its logs (followed), allocation, audit records and the cancel button;
* ``simulate-html.png`` - the top of ``rlsched simulate --html`` for three policies.

Run from the repository root: ``python benchmarks/screenshots.py`` (about 30 s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.service.serving import Served, http, start_serve, wait_for, write_workspace  # noqa: E402
from tests.service.ui_harness import open_browser, why_no_browser  # noqa: E402

VIEWPORT = {"width": 1440, "height": 1000}


def submit(svc: Served, argv: list[str], **extra: object) -> str:
    status, _, body = http("POST", svc.url + "/v1/jobs", token=svc.token, body={"argv": argv, **extra})
    if status != 201:
        raise SystemExit(f"submit failed ({status}): {body.decode(errors='replace')}")
    return str(json.loads(body)["id"])


def state(svc: Served, job: str) -> str:
    return str(json.loads(http("GET", f"{svc.url}/v1/jobs/{job}", token=svc.token)[2])["state"])


def fill(svc: Served) -> str:
    """Jobs that make every panel say something; returns the id of a running job with output."""
    py = shutil.which("python3") or sys.executable
    talker = ("import time\nfor i in range(600):\n    print(f'step {i}: loss {1 / (i + 1):.4f}', flush=True)\n"
              "    time.sleep(0.5)")
    hostile = submit(svc, ["echo", "<script>alert('hi')</script>"], gpus=1, user="mallory")
    wait_for(lambda: state(svc, hostile) == "done", what="the hostile job to finish")
    main = submit(svc, [py, "-c", talker], gpus=2, user="alice", priority=5)
    submit(svc, ["sleep", "600"], gpus=2, user="intern")
    submit(svc, ["sleep", "600"], mig="3g.40gb", user="bob")
    submit(svc, ["sleep", "600"], mig="1g.10gb", user="carol")
    submit(svc, ["sleep", "600"], mig="2g.20gb", user="carol")
    wait_for(lambda: state(svc, main) == "running", what="the main job to run")
    submit(svc, ["sleep", "600"], gpus=2, user="dave", priority=3)
    submit(svc, ["sleep", "600"], gpus=1, user="intern")
    time.sleep(3)
    return main


def shoot(svc: Served, out: Path, job: str) -> None:
    with open_browser() as browser:
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.goto(svc.url + "/ui/")
        page.wait_for_selector("#welcome")
        page.screenshot(path=str(out / "login.png"))
        page.fill("#token", svc.token)
        page.click("#login-button")
        page.wait_for_selector("#fleet .node")
        page.wait_for_timeout(2500)
        page.screenshot(path=str(out / "overview.png"), full_page=True)
        page.goto(f"{svc.url}/ui/#/jobs/{job}")
        page.wait_for_selector("#log")
        page.wait_for_timeout(4500)
        page.screenshot(path=str(out / "job.png"), full_page=True)

        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.html"
            subprocess.run([sys.executable, "-m", "rlsched", "simulate", "--max-jobs", "300", "--policy", "fifo",
                            "--policy", "sjf", "--policy", "tiresias", "--html", str(report), "--quiet"],
                           check=True, cwd=tmp)
            page.set_viewport_size({"width": 1700, "height": 1300})
            page.goto(report.as_uri())
            page.screenshot(path=str(out / "simulate-html.png"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    why = why_no_browser()
    if why is not None:
        raise SystemExit(why)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spec, fleet = write_workspace(root)
        # a price on the whole-GPU pool, so the cost panel has something to add up
        spec.write_text(spec.read_text().replace('mig       = "disabled"',
                                                 'mig       = "disabled"\n  cost_per_gpu_hour = 2.5', 1))
        svc = start_serve(spec, fleet, root / "state")
        try:
            shoot(svc, args.out, fill(svc))
        finally:
            for j in json.loads(http("GET", svc.url + "/v1/jobs?state=running&state=queued", token=svc.token)[2]):
                http("POST", f"{svc.url}/v1/jobs/{j['id']}/cancel", token=svc.token)
            svc.stop()
    for name in ("login.png", "overview.png", "job.png", "simulate-html.png"):
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
