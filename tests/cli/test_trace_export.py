"""``rlsched trace export``: the service store's history as a canonical trace, read-only."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.runtime.store import Allocation, Store
from rlsched.workload import read_canonical
from rlsched.workload.history import HistoryError, history_csv, read_history

CLI = [sys.executable, "-m", "rlsched"]


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A store with a done job, a preempted-then-failed MIG job, a running one and a queued one."""
    clock = [1000.0]
    store = Store(tmp_path / "jobs.db", clock=lambda: clock[0])

    def at(t: float) -> None:
        clock[0] = t

    a = store.submit(["sleep", "60"], gpus=2, user="ana", priority=3)
    b = store.submit(["train.py", "--secret"], mig_profile="3g.40gb", user="bo", preemptible=True, deadline=1090.0)
    c = store.submit(["serve.py"], gpus=1, user="cy")
    store.submit(["never"], gpus=1, user="dee")
    at(1010)
    store.mark_running(a, Allocation("n1", ("g0", "g1")), 11, 1)
    at(1020)
    store.mark_running(b, Allocation("n1", ("m0",)), 12, 1)
    at(1030)
    store.preempt(b)
    at(1035)
    store.requeue(b, "priority")
    at(1040)
    store.mark_running(b, Allocation("n1", ("m0",)), 13, 1)
    store.mark_running(c, Allocation("n2", ("g2",)), 14, 1)
    at(1070)
    store.mark_finished(a, 0)
    at(1100)
    store.mark_finished(b, 1)
    store.close()
    return tmp_path


def test_history_rows_keep_attempts_apart(state_dir: Path) -> None:
    export = read_history(state_dir / "jobs.db", now=1200.0)
    by_user = {j.user: j for j in export.jobs}
    assert set(by_user) == {"ana", "bo", "cy"} and export.not_started == {"queued": 1}
    ana, bo, cy = by_user["ana"], by_user["bo"], by_user["cy"]
    assert (ana.duration(1200), ana.attempts, ana.run_s_total, ana.wait_s, ana.outcome) == (60, 1, 60, 10, "done")
    # the preempted attempt (1020-1035) is not the duration; it is in run_s_total and restarts
    assert (bo.duration(1200), bo.attempts, bo.run_s_total, bo.wait_s, bo.outcome) == (60, 2, 75, 20, "failed")
    assert bo.mig_profile == "3g.40gb" and bo.missed_deadline()
    assert cy.censored and cy.duration(1200) == 160 and cy.outcome == "running"


def test_cli_export_reads_back_as_a_canonical_trace(state_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "jobs.csv"
    res = subprocess.run([*CLI, "trace", "export", "--state-dir", str(state_dir), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "wrote 3 jobs" in res.stdout and "1 restarted" in res.stdout and "1 never started" in res.stdout
    text = out.read_text()
    assert "--secret" not in text and "argv" not in text.splitlines()[0]
    trace = read_canonical(out)
    jobs = {j.user: j for j in trace.jobs}
    assert jobs["ana"].num_gpus == 2 and jobs["ana"].priority == 3 and jobs["ana"].submit_time == 0
    assert jobs["bo"].gpu_milli < 1000 and jobs["bo"].preemptible and jobs["bo"].deadline == 90
    assert jobs["cy"].duration_censored and not jobs["ana"].duration_censored
    header = text.splitlines()[0].split(",")
    row = dict(zip(header, next(line for line in text.splitlines() if ",bo," in line).split(","), strict=True))
    assert (row["attempts"], row["restarts"], row["run_s_total"], row["outcome"]) == ("2", "1", "75", "failed")


def test_commands_only_when_asked_for(state_dir: Path) -> None:
    export = read_history(state_dir / "jobs.db", now=1200.0, with_commands=True)
    text = history_csv(export, with_commands=True)
    assert '""train.py"", ""--secret""' in text and text.splitlines()[0].endswith(",argv,cwd")


def test_since_keeps_only_recent_submissions(state_dir: Path) -> None:
    assert read_history(state_dir / "jobs.db", now=1000.0 + 86400, since_s=3600).jobs == []
    assert len(read_history(state_dir / "jobs.db", now=1200.0, since_s=3600).jobs) == 3


def test_export_is_read_only_and_works_while_a_writer_holds_the_lock(state_dir: Path) -> None:
    db = state_dir / "jobs.db"
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE jobs SET priority = 9 WHERE user = 'dee'")
    try:
        assert len(read_history(db, now=1200.0).jobs) == 3
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_not_a_state_dir_is_one_clear_line(tmp_path: Path) -> None:
    res = subprocess.run([*CLI, "trace", "export", "--state-dir", str(tmp_path), "--out", str(tmp_path / "x.csv")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "no service store here" in res.stderr
    with pytest.raises(HistoryError):
        from rlsched.workload.history import db_path_of

        db_path_of(tmp_path)
