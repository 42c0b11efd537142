"""Numbers that must not look like bugs (issue 22.8) and a comparison table that fits the terminal (22.10).

Through the real CLI in-process (CliRunner) on the Philly test slice: the table separates jobs the
horizon cut off (``unfinished``) from jobs no pool could hold (``unsched``), the horizon's stop is
not a preemption, a preempting policy with nothing preemptible says so, identical results are named,
and a narrow terminal drops columns instead of squeezing them to ellipses.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlsched.cli.commands  # noqa: F401  (registers every command)
from rlsched.cli.app import app
from rlsched.report.table import COLUMNS, comparison_notes, fitted_columns, identical_groups
from rlsched.sim.metrics import HORIZON_REASON, Report
from rlsched.train.evaluate import comparison_markdown, ratio_text

DATA = Path(__file__).resolve().parents[1] / "data"
PHILLY = ["simulate", "--trace", str(DATA / "philly_slice.csv"), "--cluster", "2x8xV100-16GB"]


def _simulate(monkeypatch: pytest.MonkeyPatch, columns: int, *args: str) -> str:
    import rlsched.cli.simulate_cmd as simulate_cmd
    from rlsched.report.terminal import output_console

    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(simulate_cmd, "_console", output_console())
    result = CliRunner().invoke(app, [*args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_horizon_cutoff_is_unfinished_not_unschedulable_nor_preempted(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    text = _simulate(monkeypatch, 200, *PHILLY, "-p", "fifo", "--horizon", "20000", "--json", str(out))
    r = json.loads(out.read_text())["results"][0]
    assert r["jobs_unfinished"] > 0 and r["jobs_unschedulable"] == r["jobs_unfinished"]  # JSON: total, and the part
    assert r["preemptions"] == 0  # stopping jobs at the horizon ends the run; nobody preempted them
    header = next(line for line in text.splitlines() if "policy" in line)
    row = next(line for line in text.splitlines() if "fifo" in line)
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    heads = [c.strip() for c in header.strip("│┃ ").split("┃")]
    assert cells[heads.index("unsched")] == "0"
    assert cells[heads.index("unfinished")] == f"{r['jobs_unfinished']:,}"
    assert "unfinished: jobs still queued or running when the simulation horizon ended the run" in text
    assert "unschedulable:" not in text  # the horizon is not a reason a job could never run


def test_tiresias_without_preemptible_jobs_says_why_it_preempted_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _simulate(monkeypatch, 200, *PHILLY, "-p", "tiresias", "-p", "weighted-priority", "--max-jobs", "150")
    flat = " ".join(text.split())
    assert "tiresias: 0 preemptions because none of the 150 jobs is preemptible" in flat
    assert "identical results (every metric equal): tiresias = weighted-priority" in flat
    preempting = _simulate(monkeypatch, 200, *PHILLY, "-p", "tiresias", "--max-jobs", "150", "--preemptible", "all")
    assert "0 preemptions because" not in preempting


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_the_table_fits_the_terminal_and_names_what_it_left_out(monkeypatch: pytest.MonkeyPatch,
                                                                columns: int) -> None:
    text = _simulate(monkeypatch, columns, *PHILLY, "-p", "fifo", "-p", "sjf", "--max-jobs", "150")
    lines = text.splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= columns, text
    assert "…" not in "\n".join(table)  # columns are dropped, never squeezed to ellipses
    assert "mean JCT" in table[1] and "cost USD" in table[1]
    assert "not shown, to fit the terminal:" in " ".join(text.split())


def test_a_wide_terminal_shows_every_column(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _simulate(monkeypatch, 240, *PHILLY, "-p", "fifo", "--max-jobs", "100")
    header = next(line for line in text.splitlines() if "policy" in line)
    assert all(c.header in header for c in COLUMNS)
    assert "not shown" not in text


def _report(policy: str, cost: float = 10.0, unfinished: int = 0, wall: float = 1.0) -> Report:
    return Report(policy=policy, mean_jct_s=3600.0, p95_jct_s=7200.0, mean_wait_s=60.0, p95_wait_s=600.0,
                  makespan_s=86400.0, gpu_utilization=0.5, cost_usd=cost, cost_ondemand_usd=cost, cost_spot_usd=0.0,
                  preemptions=0, restarts=0, lost_gpu_hours=0.0, deadline_misses=0, jobs_completed=90,
                  jobs_unschedulable=3 + unfinished, jobs_skipped=0, refused_decisions=0, wall_s=wall,
                  unschedulable_reasons={"needs 16 GPUs": 3, **({HORIZON_REASON: unfinished} if unfinished else {})})


def test_identical_results_group_by_every_metric_but_wall_time() -> None:
    reports = [_report("a", wall=1.0), _report("b", cost=11.0), _report("c", wall=9.0)]
    assert [[r.policy for r in g] for g in identical_groups(reports)] == [["a", "c"], ["b"]]
    assert comparison_notes(reports) == ["identical results (every metric equal): a = c"]
    r = _report("x", unfinished=4)
    assert (r.jobs_unfinished, r.jobs_never_schedulable, r.result()["jobs_unfinished"]) == (4, 3, 4)


def test_columns_that_are_zero_everywhere_go_first() -> None:
    shown, hidden = fitted_columns([_report("a"), _report("b", cost=11.0)], "t", 100)
    assert {"preempt", "dl miss", "unfinished"} <= {c.header for c in hidden}
    assert {"mean JCT", "p95 wait", "cost USD", "unsched"} <= {c.header for c in shown}


def test_no_cost_ratio_against_a_weighted_priority_that_paid_nothing() -> None:
    """On an on-prem fleet nothing is bought: the evaluation table shows '-' for cost vs WP, not 1.000."""
    from rlsched.cluster.shorthand import parse_cluster
    from rlsched.scenario import Scenario, build_market, load_jobs
    from rlsched.train.evaluate import evaluate
    from rlsched.train.worlds import World

    assert ratio_text(math.nan) == "-" and ratio_text(None) == "-" and ratio_text(0.5) == "0.500"
    pools = parse_cluster("2x8xV100-16GB")
    raw, src = load_jobs([{"path": "bundled:philly-3day.csv", "max_jobs": 40}], None)
    world = World("onprem", Scenario("onprem", pools, raw, build_market("default", pools), source=src))
    res = evaluate([world], None, heuristics=["weighted-priority", "sjf"])
    assert res["summary"]["weighted-priority"]["cost_usd"] == 0
    assert math.isnan(res["relative"]["sjf"]["cost_vs_weighted_priority"])
    md = comparison_markdown(res, "eval")
    row = next(line for line in md.splitlines() if line.startswith("| sjf"))
    assert re.search(r"\| \d\.\d{3} \| - \|", row), row  # JCT ratio, then no cost ratio
    assert "nan" not in md
