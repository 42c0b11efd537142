"""The Grafana board: regenerating it gives the checked-in file, and every metric its queries name is one the
service really exports (the families of a running service's registry, dashboard collector included)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlsched.service.board import board_for
from tests.service import service

pytest.importorskip("grafanalib", reason="the dashboard generator needs grafanalib (pip install -e '.[test]')")

from rlsched.service.grafana import DEFAULT_OUT, dashboard_json, main, panel_queries

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / DEFAULT_OUT


def exported_series(tmp_path: Path) -> set[str]:
    """Every series name a running service's /metrics can carry (``_total``, ``_bucket``... included)."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("_count", "_sum", "_created", ""), "gauge": ("",), "info": ("_info",)}
    with service(tmp_path) as svc:
        assert board_for(svc) is not None  # registers the cost and node families like the API does
        svc.tick()
        return {m.name + s for m in svc.registry.collect() for s in suffixes.get(m.type, ("",))}


def test_regenerating_gives_the_checked_in_file() -> None:
    assert CHECKED_IN.read_text() == dashboard_json(), "regenerate with: python -m rlsched.service.grafana"
    assert main(["--check", "--out", str(CHECKED_IN)]) == 0


def test_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "rlsched.json"
    stale.write_text("{}\n")
    assert main(["--check", "--out", str(stale)]) == 1
    assert main(["--out", str(stale)]) == 0 and main(["--check", "--out", str(stale)]) == 0


def test_every_metric_in_a_panel_query_is_exported(tmp_path: Path) -> None:
    data = json.loads(CHECKED_IN.read_text())
    queries = panel_queries(data)
    assert len(queries) >= 15
    used = {name for q in queries for name in re.findall(r"\brlsched_[a-z0-9_]+", q)}
    exported = exported_series(tmp_path)
    assert used - exported == set(), f"queries name metrics the service does not export: {used - exported}"
    # the subjects each have a panel
    for needed in ("rlsched_allocated_gpus", "rlsched_allocated_mig_slices", "rlsched_queue_length",
                   "rlsched_job_wait_seconds_bucket", "rlsched_decisions_total", "rlsched_fallbacks_total",
                   "rlsched_cost_rate_usd_per_hour"):
        assert needed in used, needed


def test_panels_read_the_chosen_data_source() -> None:
    data = json.loads(CHECKED_IN.read_text())
    assert [v["name"] for v in data["templating"]["list"]] == ["datasource"]
    for panel in data["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == "${datasource}", panel["title"]
