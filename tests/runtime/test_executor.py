"""LocalExecutor with real processes: env isolation, no shell, logs, exit codes, stop, adoption."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlsched.runtime.executor import (
    EXIT_LOST,
    EXIT_NOT_FOUND,
    ExecutorError,
    Launched,
    LocalExecutor,
    proc_start_time,
    read_exit_file,
)

PY = sys.executable
GPU = "GPU-8a6d6a1c-0000-4000-8000-000000000001"
MIG = "MIG-5b2f4a6e-0000-4000-8000-000000000002"

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _wait_for(path: Path, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}: {path.read_text() if path.exists() else '(missing)'}")


@pytest.fixture
def ex(tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(tmp_path / "logs")


def test_gpu_env_is_exactly_the_allocation_and_argv_is_not_shell_interpreted(
        ex: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the service's own value must not leak
    marker = tmp_path / "pwned"
    nasty = ["a b", "it's \"quoted\"", f"; touch {marker}", "$(touch " + str(marker) + ")", "`id`", "*"]
    code = ("import json, os, sys; print(json.dumps({'argv': sys.argv[1:], "
            "'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), 'nv': os.environ.get('NVIDIA_VISIBLE_DEVICES'), "
            "'extra': os.environ.get('RLSCHED_TEST'), 'sid': os.getsid(0), 'pgid': os.getpgid(0)}))")
    h = ex.launch("job-1", [PY, "-c", code, *nasty], [GPU, MIG], {"RLSCHED_TEST": "x y"})
    assert ex.wait(h, 30) == 0
    line = next(ln for ln in h.log_path.read_text().splitlines() if ln.startswith("{"))
    seen = json.loads(line)
    assert seen["argv"] == nasty
    assert seen["cuda"] == seen["nv"] == f"{GPU},{MIG}"
    assert seen["extra"] == "x y"
    assert seen["sid"] == h.pid and seen["pgid"] == h.pid  # own session and group, led by the wrapper
    assert not marker.exists()


def test_no_devices_means_none_visible(ex: LocalExecutor) -> None:
    h = ex.launch("cpu", [PY, "-c", "import os; print('[' + os.environ['CUDA_VISIBLE_DEVICES'] + ']')"], [])
    assert ex.wait(h, 30) == 0
    assert "[]" in h.log_path.read_text()


@pytest.mark.parametrize("bad", [
    {"argv": "echo hi", "devices": [GPU]},
    {"argv": [], "devices": [GPU]},
    {"argv": ["true"], "devices": ["0"]},
    {"argv": ["true"], "devices": ["GPU-1,GPU-2"]},
    {"argv": ["true"], "devices": [GPU], "env": {"CUDA_VISIBLE_DEVICES": "all"}},
    {"argv": ["true"], "devices": [GPU], "job": "../escape"},
])
def test_launch_refuses_unsafe_input(ex: LocalExecutor, bad: dict[str, object]) -> None:
    with pytest.raises(ExecutorError):
        ex.launch(str(bad.get("job", "j")), bad["argv"], bad["devices"], bad.get("env"))  # type: ignore[arg-type]


def test_logs_and_exit_codes_are_recorded(ex: LocalExecutor) -> None:
    h = ex.launch("j", [PY, "-c", "import sys; print('to-out'); print('to-err', file=sys.stderr); sys.exit(7)"], [GPU])
    assert ex.wait(h, 30) == 7
    log = h.log_path.read_text()
    assert "to-out" in log and "to-err" in log and "=== rlsched: launch j" in log
    assert read_exit_file(h.exit_file) == 7
    # a second attempt appends to the same log, with its own exit file
    h2 = ex.launch("j", [PY, "-c", "print('again')"], [GPU])
    assert ex.wait(h2, 30) == 0
    assert h2.exit_file != h.exit_file and read_exit_file(h2.exit_file) == 0
    assert "to-out" in h2.log_path.read_text() and "again" in h2.log_path.read_text()


def test_missing_program_is_127(ex: LocalExecutor, tmp_path: Path) -> None:
    h = ex.launch("j", [str(tmp_path / "no-such-program")], [])
    assert ex.wait(h, 30) == EXIT_NOT_FOUND
    assert "cannot start" in h.log_path.read_text()


def test_stop_sigterm_then_sigkill_after_grace(ex: LocalExecutor) -> None:
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(120)")
    h = ex.launch("stubborn", [PY, "-c", stubborn], [GPU])
    _wait_for(h.log_path, "ready")
    t0 = time.monotonic()
    rc = ex.stop(h, grace_s=0.5)
    took = time.monotonic() - t0
    assert rc == -9  # the group (wrapper included) was SIGKILLed: no exit file
    assert 0.5 <= took < 15
    assert not h.exit_file.exists()
    assert proc_start_time(h.pid) is None


def test_stop_graceful_job_reports_sigterm(ex: LocalExecutor) -> None:
    h = ex.launch("polite", [PY, "-c", "import time; print('ready', flush=True); time.sleep(120)"], [GPU])
    _wait_for(h.log_path, "ready")
    assert ex.stop(h, grace_s=20) == -15
    assert read_exit_file(h.exit_file) == -15  # the wrapper outlived the job and recorded it


def test_stop_kills_the_whole_process_group(ex: LocalExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
        open({str(pidfile)!r}, 'w').write(str(p.pid))
        print('ready', flush=True)
        time.sleep(120)
    """)
    h = ex.launch("tree", [PY, "-c", code], [GPU])
    _wait_for(h.log_path, "ready")
    grandchild = int(pidfile.read_text())
    ex.stop(h, grace_s=10)
    deadline = time.monotonic() + 10
    while proc_start_time(grandchild) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    state = Path(f"/proc/{grandchild}/stat").read_text().split(")")[-1].split()[0] if proc_start_time(
        grandchild) is not None else "gone"
    assert state in ("gone", "Z")


def _launch_from_another_process(log_dir: Path, argv: list[str]) -> dict[str, object]:
    """Launch via a separate 'service' process that then exits, as a restarted service would find it."""
    code = textwrap.dedent(f"""
        import json, sys
        from rlsched.runtime.executor import LocalExecutor
        h = LocalExecutor({str(log_dir)!r}).launch('adopt-me', {argv!r}, [{GPU!r}])
        print(json.dumps({{'pid': h.pid, 'start': h.start_time, 'exit_file': str(h.exit_file),
                          'log': str(h.log_path)}}))
    """)
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_adopt_after_restart_and_recover_exit_code(tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = [PY, "-c", f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\nsys.exit(42)"]
    info = _launch_from_another_process(tmp_path / "logs", job)
    ex = LocalExecutor(tmp_path / "logs")  # a fresh executor: no Popen object, not the parent
    pid, start = int(info["pid"]), int(info["start"])  # type: ignore[call-overload]
    h = ex.adopt(pid, start)
    assert h is not None
    assert str(h.exit_file) == info["exit_file"]  # recovered from the wrapper's command line
    assert h.job_id == "adopt-me" and str(h.log_path) == info["log"]
    assert ex.poll(h) is None
    go.touch()
    assert ex.wait(h, 30) == 42


def test_adopt_refuses_wrong_start_time_and_foreign_processes(tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path / "logs")
    h = ex.launch("j", [PY, "-c", "import time; time.sleep(120)"], [GPU])
    try:
        assert ex.adopt(h.pid, h.start_time + 1) is None  # pid reused by someone else
        assert ex.adopt(h.pid, h.start_time) is not None
        assert ex.adopt(2**22 + 12345, 1) is None  # no such pid
        # right pid and start time, but not one of our wrappers: never adopted
        me = os.getpid()
        own_start = proc_start_time(me)
        assert own_start is not None
        assert ex.adopt(me, own_start) is None
    finally:
        ex.stop(h, grace_s=5)


def test_stop_never_signals_a_recycled_pid(tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path / "logs")
    victim = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        start = proc_start_time(victim.pid)
        assert start is not None
        stale = Launched("old", victim.pid, start - 1, tmp_path / "x.log", tmp_path / "x.exit.json")
        assert ex.poll(stale) == EXIT_LOST  # "our" process is gone, nothing recorded
        ex.stop(stale, grace_s=0.1)
        assert victim.poll() is None  # the unrelated process with the recycled pid is untouched
    finally:
        victim.kill()
        victim.wait()


def test_wrapper_cli_usage_error() -> None:
    out = subprocess.run([PY, "-m", "rlsched.runtime.executor", "--oops"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_detached_job_is_no_child_and_reports_like_one(tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path / "logs", detach=True)
    h = ex.launch("d", [PY, "-c", "import time; print('up', flush=True); time.sleep(120)"], [GPU])
    _wait_for(h.log_path, "up")
    assert _ppid(h.pid) != os.getpid() and h.start_time == proc_start_time(h.pid)
    assert ex.poll(h) is None
    assert ex.stop(h, grace_s=20) == -15  # SIGTERM to its group; the wrapper records it
    quick = ex.launch("q", [PY, "-c", "import sys; print('out'); sys.exit(3)"], [GPU])
    assert ex.wait(quick, 30) == 3  # read from the exit file: it is not ours to wait for
    assert "out" in quick.log_path.read_text()


@pytest.mark.parametrize("detach", [True, False])
def test_a_detached_job_outlives_a_launcher_that_kills_its_children(tmp_path: Path, detach: bool) -> None:
    """As a node agent's jobs must outlive the agent: a Ray worker that exits SIGKILLs its direct children."""
    launcher = textwrap.dedent(f"""
        import json, os, signal, sys
        from pathlib import Path
        from rlsched.runtime.executor import LocalExecutor
        ex = LocalExecutor({str(tmp_path / "logs")!r}, detach={detach})
        h = ex.launch("d", [sys.executable, "-c", "import time; time.sleep(120)"], [])
        print(json.dumps([h.pid, h.start_time, str(h.exit_file)]), flush=True)
        for stat in Path("/proc").glob("[0-9]*/stat"):  # what Ray does on a worker's exit
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    os.kill(int(stat.parent.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    """)
    out = subprocess.run([PY, "-c", launcher], capture_output=True, text=True, timeout=60, check=True)
    pid, start, exit_file = json.loads(out.stdout.strip().splitlines()[-1])
    ex = LocalExecutor(tmp_path / "logs")
    h = ex.adopt(pid, start, exit_file)
    try:
        if detach:
            assert h is not None and ex.poll(h) is None  # alive after its launcher exited
        else:  # the wrapper was the launcher's child: killed with it (a zombie until reaped, or gone)
            assert h is None or ex.wait(h, 30) is not None
    finally:
        if h is not None:
            ex.stop(h, grace_s=5)
