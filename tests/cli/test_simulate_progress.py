"""``rlsched simulate``'s progress bar: jobs done (not arrived) and simulated time."""

from __future__ import annotations

import re
import subprocess
import sys

from rlsched.cli.simulation import sim_clock
from rlsched.policies import make_policy
from rlsched.sim import Engine
from tests.sim.helpers import FakeMarket, job, pool


def test_progress_counts_finished_jobs_and_reports_simulated_time() -> None:
    # 8 one-GPU jobs arrive within 70 s on a 2-GPU node and run an hour each: every job has arrived
    # long before most are done, which an arrival count would have shown as a full bar
    e = Engine([pool("onprem", nodes=1, gpus=2)], [job(f"j{i}", 10.0 * i, 3600.0) for i in range(8)], FakeMarket())
    calls: list[tuple[int, int, float]] = []
    e.run(make_policy("weighted-priority"), progress=lambda done, total, sim: calls.append((done, total, sim)))
    assert calls[-1] == (8, 8, 4 * 3600.0 + 10.0)  # j7 started at 3 h + 10 s (j1 arrived at 10 s)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls) and [c[2] for c in calls] == sorted(c[2] for c in calls)
    # after the last arrival (t=70 s) the bar still showed fewer than all jobs done
    assert any(done < 8 and sim > 70.0 for done, _, sim in calls)
    assert sim_clock(5400.0) == "sim 1.5 h" and sim_clock(3 * 86400.0) == "sim 3.0 d"


def test_the_cli_bar_says_jobs_done_and_simulated_time() -> None:
    proc = subprocess.run([sys.executable, "-m", "rlsched", "simulate", "--policy", "weighted-priority",
                           "--max-jobs", "100"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"weighted-priority .* 100/100 jobs done sim \d+\.\d [hd]", proc.stderr), proc.stderr
