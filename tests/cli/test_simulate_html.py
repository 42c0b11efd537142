"""``rlsched simulate --html``: one self-contained file (inline SVG, no script, nothing fetched) that draws
every policy and escapes every string the run supplies."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from rlsched.cli.simulation import SimulationOptions, run_simulation
from rlsched.report.html import render_html

CLI = [sys.executable, "-m", "rlsched"]


def assert_self_contained(page: str) -> None:
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I), "an external reference"
    assert not re.search(r"<(script|link|iframe|object|embed|img)\b", page, re.I)
    assert "url(" not in page and "@import" not in page


def test_cli_writes_one_self_contained_file(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "report.html"
    proc = subprocess.run([*CLI, "simulate", "--max-jobs", "150", "--policy", "fifo", "--policy", "sjf",
                           "--html", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in " ".join(proc.stdout.split())
    page = out.read_text(encoding="utf-8")
    assert_self_contained(page)
    for heading in ("Job completion time (CDF", "Queueing delay (CDF", "GPU utilisation", "Queued jobs",
                    "Cumulative cost", "Nodes held", "Cost (on-demand"):
        assert heading in page, heading
    assert page.count("<svg") >= 10
    assert "fifo" in page and "sjf" in page
    assert len(list(tmp_path.iterdir())) == 1  # nothing else written beside it (no assets folder)


def test_job_times_are_the_samples_behind_the_report() -> None:
    run = run_simulation(SimulationOptions(max_jobs=120, policies=("fifo", "sjf"), quiet=True))
    assert len(run.job_times) == len(run.reports) == 2
    for report, (jct, waits) in zip(run.reports, run.job_times, strict=True):
        assert jct and len(waits) == report.jobs_completed
        assert float(np.mean(jct)) == report.mean_jct_s
        assert float(np.percentile(waits, 95)) == report.p95_wait_s


def test_policy_names_and_title_are_escaped() -> None:
    run = run_simulation(SimulationOptions(max_jobs=60, policies=("fifo", "sjf"), quiet=True))
    hostile = '<script>alert("x")</script>&<img src=x onerror=alert(1)>'
    reports = [dataclasses.replace(run.reports[0], policy=hostile), run.reports[1]]
    page = render_html(reports, run.job_times, title='<b>"title"</b>')
    assert_self_contained(page)
    assert hostile not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;b&gt;&quot;title&quot;&lt;/b&gt;" in page


def test_identical_policies_are_drawn_once() -> None:
    run = run_simulation(SimulationOptions(max_jobs=60, policies=("fifo",), quiet=True))
    twin = dataclasses.replace(run.reports[0], policy="fifo-twin")
    page = render_html([run.reports[0], twin], [run.job_times[0]] * 2, "same")
    assert "fifo = fifo-twin" in page and "drawn once" in page
    assert page.count("<polyline") == 6  # one line per chart (2 CDFs + 4 over time), not two
