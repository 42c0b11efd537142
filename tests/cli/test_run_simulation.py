"""``run_simulation``: the simulate command's run, called as a function (no command line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsched.cli.simulation import SimulationOptions, run_simulation
from rlsched.errors import ScenarioError

DATA = Path(__file__).resolve().parents[1] / "data"
SLICE = DATA / "philly_slice.csv"


def test_one_report_per_policy_in_order() -> None:
    run = run_simulation(SimulationOptions(trace=SLICE, cluster="2x8xV100-16GB", policies=("fifo", "sjf"),
                                           max_jobs=40, quiet=True))
    assert [r.policy for r in run.reports] == ["fifo", "sjf"] == [s.name for s in run.schedulers]
    assert len(run.jobs) == 40 and run.title == "philly_slice.csv: 40 jobs on 2x8xV100-16GB"
    for r in run.reports:  # every job is accounted for: done, or too big for the 16 GPUs
        res = r.result()
        assert res["jobs_completed"] + res["jobs_unschedulable"] == 40 and res["jobs_completed"] > 0


def test_the_json_is_what_the_command_writes(tmp_path: Path) -> None:
    import rlsched.cli.commands  # noqa: F401  (registers every command)
    from rlsched.cli.app import app

    out = tmp_path / "r.json"
    args = ["simulate", "--trace", str(SLICE), "--cluster", "2x8xV100-16GB", "-p", "fifo", "--max-jobs", "30",
            "--seed", "4", "-q", "--json", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    run = run_simulation(SimulationOptions(trace=SLICE, cluster="2x8xV100-16GB", policies=("fifo",), max_jobs=30,
                                           seed=4, quiet=True))
    written, direct = json.loads(out.read_text()), run.to_json()
    for doc in (written, direct):
        for r in doc["results"]:
            r.pop("wall_s", None)
    assert written == direct and direct["seed"] == 4


def test_options_set_the_world_knobs() -> None:
    run = run_simulation(SimulationOptions(trace=SLICE, cluster="2x8xV100-16GB", policies=("fifo",), max_jobs=10,
                                           checkpoint_interval=900.0, oracle=True, horizon=5e5, quiet=True))
    assert (run.sim.checkpoint_interval_s, run.sim.oracle_durations, run.sim.horizon_s) == (900.0, True, 5e5)
    # without --horizon: 10 x the arrival span, at least span + 30 days
    run = run_simulation(SimulationOptions(trace=SLICE, cluster="2x8xV100-16GB", policies=("fifo",), max_jobs=10,
                                           quiet=True))
    span = run.jobs[-1].submit_time - run.jobs[0].submit_time
    assert run.sim.horizon_s == max(10 * span, span + 30 * 86400.0)


@pytest.mark.parametrize(("opts", "needle"), [
    (SimulationOptions(trace=SLICE), "--trace and --cluster go together"),
    (SimulationOptions(scenario=Path("x.yaml"), cluster="1x8xH100-80GB"), "--scenario already names"),
    (SimulationOptions(pools=Path("p.hcl"), cluster="1x8xH100-80GB"), "--pools and --cluster both"),
    (SimulationOptions(trace=SLICE, cluster="1x8xV100-16GB", checkpoint_interval=-1.0), "--checkpoint-interval"),
    (SimulationOptions(trace=SLICE, cluster="1x8xV100-16GB", horizon=0.0), "--horizon must be > 0"),
])
def test_contradicting_or_out_of_range_options_raise(opts: SimulationOptions, needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        run_simulation(opts)
