"""The node agent without Ray: what it refuses, what it keeps across a restart, how it fences."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from rlsched.runtime.backend import BackendError
from rlsched.runtime.executor import EXIT_LOST, ExecutorError
from rlsched.runtime.fleet.agent import JobLaunch, NodeAgent
from rlsched.runtime.sim_backend import build_fleet, write_json_atomic

PY = sys.executable


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.json"
    write_json_atomic(path, build_fleet("1x2xA100-80GB,1x2xH100-80GB:balanced", hostname_prefix="n"))
    return path


def agent(tmp_path: Path, fleet: Path) -> NodeAgent:
    return NodeAgent(f"sim:{fleet}", str(tmp_path / "agent"))


def wait_rc(a: NodeAgent, job: str, pid: int, start: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while (rc := a.poll("n-a100-01", job, pid, start)) is None:
        assert time.monotonic() < deadline, "job did not end"
        time.sleep(0.05)
    return rc


def test_hello_names_every_node_of_its_backend(tmp_path: Path, fleet: Path) -> None:
    hello = agent(tmp_path, fleet).hello()
    assert hello["hosts"] == ["n-a100-01", "n-h100-01"] and hello["error"] == ""
    assert hello["pid"] == os.getpid() and Path(hello["state_dir"]) == tmp_path / "agent"


def test_an_agent_without_nvml_stays_up_and_says_why(tmp_path: Path) -> None:
    a = NodeAgent("nvml", str(tmp_path / "agent"), hostname="gpu-7")
    hello = a.hello()
    assert hello["hosts"] == ["gpu-7"] and "NVML" in hello["error"]
    with pytest.raises(BackendError, match=r"node gpu-7: .*NVML"):
        a.inventory()


def test_launch_runs_with_exactly_its_devices_and_refuses_another_nodes(tmp_path: Path, fleet: Path) -> None:
    a = agent(tmp_path, fleet)
    inv = {n.hostname: n for n in a.inventory()}
    mine, other = inv["n-a100-01"].gpus[0].uuid, inv["n-h100-01"].gpus[0].uuid
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['RLSCHED_X'])"
    h, superseded = a.launch("n-a100-01", "j-1", [PY, "-c", code], [mine], {"RLSCHED_X": "hi"})
    assert superseded is None
    assert h.node == "n-a100-01"
    assert wait_rc(a, "j-1", h.pid, h.start_time) == 0
    assert f"{mine} hi" in a.read_log("n-a100-01", "j-1", 0).decode()
    assert a.read_log("n-a100-01", "j-1", 10**9) == b""
    with pytest.raises(ExecutorError, match=f"node n-a100-01 has no device {other}"):
        a.launch("n-a100-01", "j-2", [PY, "-c", "pass"], [other])


def test_a_restarted_agent_readopts_and_fences_from_its_table(tmp_path: Path, fleet: Path) -> None:
    a = agent(tmp_path, fleet)
    dev = a.inventory()[0].gpus[1].uuid
    h, _ = a.launch("n-a100-01", "j-long", [PY, "-c", "import time; time.sleep(60)"], [dev])
    try:
        again = agent(tmp_path, fleet)  # a new incarnation over the same state dir
        assert again.jobs() == [("n-a100-01", "j-long", h.pid, h.start_time)]
        assert again.running_jobs("n-a100-01") == 1
        assert again.poll("n-a100-01", "j-long", h.pid, h.start_time) is None
        assert again.fence("n-a100-01", "j-long", h.pid + 1) is False  # another pid: never touched
        assert again.fence("n-a100-01", "j-long", h.pid) is True
        # the whole group, wrapper included, is killed: no exit status was recorded
        assert wait_rc(again, "j-long", h.pid, h.start_time) == EXIT_LOST
        assert again.jobs() == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(h.pid, signal.SIGKILL)


def test_poll_of_a_process_that_is_not_ours_reports_lost(tmp_path: Path, fleet: Path) -> None:
    a = agent(tmp_path, fleet)
    assert a.poll("n-a100-01", "j-none", 2**22 - 1, 12345) == EXIT_LOST
    assert a.find("n-a100-01", "j-none") is None


def test_a_corrupt_table_entry_costs_only_itself(tmp_path: Path, fleet: Path) -> None:
    a = agent(tmp_path, fleet)
    dev = a.inventory()[0].gpus[0].uuid
    h, _ = a.launch("n-a100-01", "j-ok", [PY, "-c", "import time; time.sleep(30)"], [dev])
    try:
        table = tmp_path / "agent" / "jobs.json"
        data = json.loads(table.read_text())
        data.append({"node": "n-a100-01", "job": "j-bad", "pid": "x"})
        table.write_text(json.dumps(data))
        assert [j[1] for j in agent(tmp_path, fleet).jobs()] == ["j-ok"]

    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(h.pid, signal.SIGKILL)


def test_a_new_attempt_supersedes_a_stray_of_the_same_job(tmp_path: Path, fleet: Path) -> None:
    a = agent(tmp_path, fleet)
    dev = a.inventory()[0].gpus[0].uuid
    first, _ = a.launch("n-a100-01", "j-again", [PY, "-c", "import time; time.sleep(60)"], [dev])
    second, superseded = a.launch("n-a100-01", "j-again", [PY, "-c", "import time; time.sleep(60)"], [dev])
    assert superseded == first.pid
    try:
        assert wait_rc(a, "j-again", first.pid, first.start_time) == EXIT_LOST
        assert a.jobs() == [("n-a100-01", "j-again", second.pid, second.start_time)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(second.pid, signal.SIGKILL)


def test_an_agent_told_none_manages_nothing_and_reports_no_problem(tmp_path: Path) -> None:
    a = NodeAgent("none", str(tmp_path / "agent"), hostname="head")
    assert (a.hello()["hosts"], a.hello()["error"], a.inventory(), a.jobs()) == ([], "", [], [])
    with pytest.raises(BackendError, match="head: RLSCHED_AGENT_BACKEND=none"):
        a.node("head")


def test_an_unknown_backend_form_is_the_agents_error(tmp_path: Path) -> None:
    hello = NodeAgent("gpu", str(tmp_path / "agent")).hello()
    assert "RLSCHED_AGENT_BACKEND='gpu': expected 'nvml', 'sim:PATH.json' or 'none'" in hello["error"]


def test_a_launch_from_a_replaced_service_is_refused_and_starts_nothing(tmp_path: Path, fleet: Path) -> None:
    # The race it closes: a service dies with a launch on its way; its successor claims the agent, finds no
    # process of the job and requeues it; the late launch then arrives. It must start nothing.
    a = agent(tmp_path, fleet)
    dev = a.inventory()[0].gpus[0].uuid
    assert a.hello()["epoch"] == 0
    assert a.claim(20) == 20
    assert a.claim(10) == 20  # never lowered: an older service cannot take the node back
    assert a.find("n-a100-01", "j-late") is None  # the successor looks, finds nothing (and requeues)
    with pytest.raises(ExecutorError, match=r"launch of job j-late on n-a100-01 refused: .*replaced "
                                            r"\(epoch 19; this node answers to epoch 20\)"):
        a.start("n-a100-01", "j-late", JobLaunch((PY, "-c", "print('ran')"), (dev,)), epoch=19)
    assert a.jobs() == [] and a.find("n-a100-01", "j-late") is None
    assert not (tmp_path / "agent" / "logs" / "n-a100-01" / "j-late.log").exists()
    # the successor's own launch (its epoch, or a later one) runs
    h, _ = a.start("n-a100-01", "j-late", JobLaunch((PY, "-c", "print('ran')"), (dev,)), epoch=20)
    assert wait_rc(a, "j-late", h.pid, h.start_time) == 0
    h, _ = a.start("n-a100-01", "j-next", JobLaunch((PY, "-c", "pass"), (dev,)), epoch=21)
    assert wait_rc(a, "j-next", h.pid, h.start_time) == 0
    # the epoch outlives the agent: a restarted agent still refuses the replaced service
    again = agent(tmp_path, fleet)
    assert again.hello()["epoch"] == 21
    with pytest.raises(ExecutorError, match="refused"):
        again.start("n-a100-01", "j-zombie", JobLaunch((PY, "-c", "pass"), (dev,)), epoch=20)
    with pytest.raises(ExecutorError, match="refused"):  # a service that predates fencing (no epoch) too
        again.launch("n-a100-01", "j-zombie", [PY, "-c", "pass"], [dev])


def test_a_corrupt_epoch_file_is_epoch_zero_and_said(tmp_path: Path, fleet: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    a = agent(tmp_path, fleet)
    a.claim(7)
    assert not [r for r in caplog.records if "epoch" in r.getMessage()]
    (tmp_path / "agent" / "epoch").write_text("not a number")
    with caplog.at_level("WARNING", logger="rlsched.runtime.fleet.agent"):
        assert agent(tmp_path, fleet).hello()["epoch"] == 0
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "unreadable service epoch" in said[0] and str(tmp_path / "agent" / "epoch") in said[0]


def test_an_agent_of_an_older_rlsched_is_sent_the_old_launch() -> None:
    # A detached agent outlives a service upgrade and runs its old code until it restarts: it has neither
    # ``claim`` nor ``start``, so the executor sends it the old ``launch`` (it fences nothing).
    from rlsched.runtime.fleet.directory import AgentRef
    from rlsched.runtime.fleet.executor import RayExecutor

    calls: list[tuple[str, tuple[object, ...]]] = []

    class Directory:
        def send(self, ref: AgentRef, method: str, *args: object) -> object:
            calls.append((method, args))
            return method

    class Old:
        def launch(self) -> None: ...

    class New(Old):
        def claim(self) -> None: ...

        def start(self) -> None: ...

    ex = RayExecutor.__new__(RayExecutor)  # only the launch routing, without a cluster
    ex.epoch, ex.directory = 42, Directory()  # type: ignore[assignment]
    run = JobLaunch(("job",), ("GPU-1",), {"A": "1"}, "/tmp")
    ex.send_launch(AgentRef("n", "m", Old(), [], "", 1), "h", "j", run)
    ex.send_launch(AgentRef("n", "m", New(), [], "", 1), "h", "j", run)
    assert calls == [("launch", ("h", "j", ["job"], ["GPU-1"], {"A": "1"}, "/tmp")), ("start", ("h", "j", run, 42))]
