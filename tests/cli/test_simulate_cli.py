"""``rlsched simulate`` through a real subprocess: outputs, JSON schema, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.policies import available
from rlsched.sim.metrics import RESULT_KEYS

DATA = Path(__file__).resolve().parents[1] / "data"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlsched", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_default_scenario_writes_table_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = run("simulate", "--json", str(out), "--plot", str(png), "--max-jobs", "300")
    assert proc.returncode == 0, proc.stderr
    assert "weighted-priority" in proc.stdout and "mean JCT" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["jobs"] == 300
    assert {r["policy"] for r in doc["results"]} == set(available())
    for r in doc["results"]:
        assert set(RESULT_KEYS) <= set(r)
        assert r["jobs_completed"] + r["jobs_unschedulable"] + r["jobs_skipped"] == 300
        assert r["refused_decisions"] == 0
        assert 0 < r["gpu_utilization"] <= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_real_philly_slice_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    proc = run("simulate", "--trace", str(DATA / "philly_slice.csv"), "--cluster", "2x8xV100-16GB",
               "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    jcts = {r["policy"]: r["mean_jct_s"] for r in doc["results"]}
    assert set(jcts) == set(available())
    assert all(v > 0 for v in jcts.values())
    # On a loaded cluster, strict FIFO cannot beat backfilling best-fit on mean wait.
    res = {r["policy"]: r for r in doc["results"]}
    assert res["fifo"]["mean_wait_s"] >= res["best-fit"]["mean_wait_s"]


def test_deterministic_under_seed(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        assert run("simulate", "-q", "--max-jobs", "200", "-p", "spot-fallback", "--seed", "3",
                   "--json", str(path)).returncode == 0
    ra, rb = json.loads(a.read_text())["results"][0], json.loads(b.read_text())["results"][0]
    ra.pop("wall_s"), rb.pop("wall_s")
    assert ra == rb


@pytest.mark.parametrize(
    ("rows", "cluster", "needle"),
    [
        ("submit_time,duration,num_gpus\n0,100,1\n5,-3,1\n", "1x8xA100-80GB", "t.csv:3 (column duration)"),
        ("submit_time,duration,num_gpus,gpu_model\n0,1,1,Z100\n", "1x8xA100-80GB", "unknown GPU model 'Z100'"),
        ("", "1x8xA100-80GB", "empty"),
        ("submit_time,duration\n0,1\n", "1x8xA100-80GB", "num_gpus"),
        ("submit_time,duration,num_gpus\n0,1,1\n", "1x8xA100-8GB", "did you mean A100-80GB"),
        ("submit_time,duration,num_gpus\n0,1,1\n", "3-1x8xA100-80GB", "group 1"),
        ("submit_time,duration,num_gpus\n0,1,1\n", "1x8xA100-80GB/mig=1g.10gb+1g.10gb+7g.80gb", "does not fit"),
    ],
)
def test_bad_input_is_one_line_error(tmp_path: Path, rows: str, cluster: str, needle: str) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(rows)
    proc = run("simulate", "--trace", str(trace), "--cluster", cluster, "-q")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0]


def test_job_larger_than_cluster_is_reported_not_dropped(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus\n0,100,1\n1,100,64\n2,10,0\n")
    out = tmp_path / "o.json"
    proc = run("simulate", "--trace", str(trace), "--cluster", "1x8xA100-80GB", "-p", "fifo", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())["results"][0]
    assert (r["jobs_completed"], r["jobs_unschedulable"], r["jobs_skipped"]) == (1, 1, 1)
    assert "asks for 64 GPUs" in proc.stdout


def test_skip_bad_rows_counts(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus\n0,100,1\n1,abc,1\n2,50,1\n")
    out = tmp_path / "o.json"
    proc = run("simulate", "--trace", str(trace), "--cluster", "1x8xA100-80GB", "-p", "fifo", "--skip-bad-rows",
               "-q", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["jobs"] == 2


def test_policies_lists_every_heuristic() -> None:
    proc = run("policies")
    assert proc.returncode == 0
    for name in ("weighted-priority", "fifo", "sjf", "tiresias", "best-fit", "fgd", "fair-share", "spot-fallback"):
        assert name in proc.stdout
    assert "parameters: thresholds=3250/7200, promote_knob=0, preempt=true" in proc.stdout
    assert "NAME:KEY=VALUE" in proc.stdout


def test_policy_spec_yaml(tmp_path: Path) -> None:
    spec = tmp_path / "wp.yaml"
    spec.write_text("policy: weighted-priority\nname: wp-fifo\nparams: {w_priority: 0.0, w_wait: 1.0}\n")
    out = tmp_path / "o.json"
    assert run("simulate", "-q", "--max-jobs", "100", "-p", str(spec), "--json", str(out)).returncode == 0
    assert json.loads(out.read_text())["results"][0]["policy"] == "wp-fifo"
    spec.write_text("policy: weighted-priority\nparams: {w_priority: -1}\n")
    proc = run("simulate", "-q", "--max-jobs", "100", "-p", str(spec))
    assert proc.returncode == 1 and "weights must be >= 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_error_exit_2() -> None:
    proc = run("simulate", "--bogus")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_simulate_declared_pools_hcl(tmp_path: Path) -> None:
    """The same HCL file that plan/apply use replays a trace (issue 4: one spec for both worlds)."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "o.json"
    proc = run("simulate", "--pools", str(root / "configs" / "onprem-mig.hcl"), "--trace",
               str(DATA / "openb_pods_slice.csv"), "-p", "fgd", "-q", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())["results"][0]
    assert r["jobs_completed"] > 0
    assert r["cost_usd"] > 0  # the spec's amortised cost_per_gpu_hour survives (no lossy round trip)
    proc = run("simulate", "--pools", str(root / "configs" / "onprem-mig.hcl"), "--cluster", "1x8xA100-80GB")
    assert proc.returncode == 1 and "use one" in proc.stderr


@pytest.mark.parametrize("config", ["local.hcl", "onprem-mig.hcl", "hybrid-spot.hcl"])
def test_every_shipped_config_simulates(tmp_path: Path, config: str) -> None:
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "o.json"
    proc = run("simulate", "--pools", str(root / "configs" / config), "--trace", str(DATA / "philly_slice.csv"),
               "-p", "weighted-priority", "-q", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())["results"][0]
    assert r["jobs_completed"] > 0 and r["refused_decisions"] == 0


def test_jobs_csv_per_policy(tmp_path: Path) -> None:
    out = tmp_path / "jobs.csv"
    proc = run("simulate", "-q", "--max-jobs", "60", "-p", "uniform-progress", "-p", "spot-greedy",
               "--deadline-factor", "3", "--preemptible", "all", "--jobs-csv", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in ("uniform-progress", "spot-greedy"):
        rows = (tmp_path / f"jobs-{name}.csv").read_text().splitlines()
        assert rows[0].startswith("job_id,submit,start,finish,jct,wait,restarts,preemptions,lost_gpu_hours")
        assert len(rows) == 61


def test_spot_flags_deadline_slack_and_observed_preemption(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    proc = run("simulate", "--trace", str(DATA / "philly_slice.csv"), "--cluster",
               "spot:0-4x8xV100-16GB,ondemand:0-4x8xV100-16GB", "--preemptible", "all", "--deadline-factor", "3",
               "--deadline-slack", "3600", "--preemption", "observed", "--load-factor", "0.5",
               "--policy", "spot-greedy", "--policy", "uniform-progress", "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    res = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    assert res["spot-greedy"]["restarts"] > 0  # the 2020 lifetimes reclaim within hours
    assert res["spot-greedy"]["cost_spot_usd"] > 0
    bad = run("simulate", "--trace", str(DATA / "philly_slice.csv"), "--cluster", "spot:0-4x8xV100-16GB",
              "--preemption", "sometimes", "--policy", "spot-greedy", "-q")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "market.preemption must be one of advisor, observed" in bad.stderr
