"""Job-supplied strings never reach the terminal raw (issue 17.4), and the job tables fit it (issue 22.10).

``status``, ``audit``, ``cancel`` and ``logs`` are driven through the real CLI against a fake
client holding jobs whose argv, user, reason and devices carry terminal escapes and rich markup.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from typer.testing import CliRunner

import rlsched.cli.commands  # noqa: F401  (registers every command)
import rlsched.cli.service_cmd as service_cmd
from rlsched.cli.app import app
from rlsched.report.jobs import audit_table, status_table
from rlsched.report.terminal import LogWriter, cell, escape_control, output_console, shell_join

ESC_TITLE = "\x1b]0;pwned\x07"  # sets the terminal's window title
CLEAR = "\x1b[2J"
UUIDS = [f"GPU-{i:08x}-fcf7-5e07-9f48-30f27fb64cb7" for i in range(4)]
MIG = "MIG-3dbede05-e785-57fc-847f-f8bfc8bf027a"
NOW = 1_800_000_000.0


def _jobs() -> list[dict[str, Any]]:
    return [
        {"id": "j-1", "state": "running", "user": f"eve{CLEAR}", "priority": 5, "seq": 1,
         "request": {"argv": ["python", f"-c{ESC_TITLE}", "print('[bold red]x[/]')"], "gpus": 4},
         "allocation": {"node": "gpu-h100-01", "devices": UUIDS},
         "submitted_at": NOW - 600, "started_at": NOW - 300, "reason": "[/]broken markup\r\x1b[1A"},
        {"id": "j-2", "state": "queued", "user": "bob", "priority": 0, "seq": 2, "position": 1,
         "request": {"argv": ["sleep", "1"], "mig": "3g.40gb"}, "submitted_at": NOW - 120,
         "reason": f"waiting for a free 3g.40gb MIG instance{ESC_TITLE}"},
        {"id": "j-3", "state": "done", "user": "bob", "priority": 0, "seq": 3, "exit_code": 0,
         "request": {"argv": ["true"], "mig": "1g.10gb"}, "allocation": {"node": "gpu-h100-02", "devices": [MIG]},
         "submitted_at": NOW - 7200, "started_at": NOW - 7000, "finished_at": NOW - 6900},
    ]


def _audit() -> list[dict[str, Any]]:
    return [
        {"id": 1, "time": NOW - 600, "event": "submission", "job": "j-1", "gpus": [], "reason": f"argv {CLEAR}"},
        {"id": 2, "time": NOW - 300, "event": "allocation", "job": "j-1", "gpus": UUIDS, "policy": "fifo",
         "model_version": "3", "reason": f"placed{ESC_TITLE} [link=http://evil]here[/link]"},
    ]


class FakeClient:
    """What the service would answer (see rlsched.service.client.Client)."""

    def __init__(self, log: bytes = b"") -> None:
        self.log = log

    def job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in _jobs() if j["id"] == job_id)

    def jobs(self, states: list[str] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return [j for j in _jobs() if states is None or j["state"] in states]

    def audit(self, **kw: Any) -> list[dict[str, Any]]:
        return _audit()

    def cancel(self, job_id: str) -> dict[str, Any]:
        return {"state": f"cancelled{ESC_TITLE}"}

    def logs(self, job_id: str, tail: int | None = None, offset: int | None = 0) -> tuple[bytes, int, str]:
        if offset:
            return b"", len(self.log), "done"
        return self.log, len(self.log), "done"


def _assert_clean(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text, repr(text)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr(service_cmd, "_client", lambda server, state_dir: client)
    monkeypatch.setenv("COLUMNS", "200")
    return client


def test_escape_control_makes_every_control_character_visible() -> None:
    assert escape_control(f"a{ESC_TITLE}b") == "a\\e]0;pwned\\ab"
    assert escape_control("x\ny\tz\x9b\x7f") == "x\\ny\\tz\\x9b\\x7f"
    assert escape_control("left\u202eright") == "left\\u202eright"  # a bidi override cannot reorder the line
    assert escape_control("line\nnext", keep="\n") == "line\nnext"
    assert escape_control("ünïcödé 名前 ok") == "ünïcödé 名前 ok"
    assert cell("[bold]x[/]").plain == "[bold]x[/]"  # no markup: shown as written


def test_shell_join_quotes_control_characters_so_the_line_pastes_back() -> None:
    assert shell_join(["echo", "a b", "it's"]) == "echo 'a b' 'it'\"'\"'s'"
    assert shell_join(["printf", f"x{ESC_TITLE}'\\"]) == "printf $'x\\e]0;pwned\\a\\'\\\\'"


def test_status_table_escapes_job_strings(fake: FakeClient) -> None:
    out = CliRunner().invoke(app, ["status"])
    assert out.exit_code == 0, out.output
    _assert_clean(out.output)
    assert "eve\\e[2J" in out.output and "\\e]0;pwned\\a" in out.output
    assert "[/]broken markup\\r\\e[1A" in out.output  # markup shown as text, not interpreted


def test_status_of_one_job_escapes_argv_as_pasteable_shell(fake: FakeClient) -> None:
    out = CliRunner().invoke(app, ["status", "j-1"])
    assert out.exit_code == 0, out.output
    _assert_clean(out.output)
    assert re.search(r"^command\s+python \$'-c\\e\]0;pwned\\a' 'print\('\"'\"'\[bold red\]x", out.output, re.M), \
        out.output
    assert re.search(r"^user\s+eve\\e\[2J$", out.output, re.M)


def test_audit_and_cancel_escape_server_strings(fake: FakeClient) -> None:
    out = CliRunner().invoke(app, ["audit"])
    assert out.exit_code == 0, out.output
    _assert_clean(out.output)
    assert "[link=http://evil]here[/link]" in out.output and "fifo@3" in out.output
    out = CliRunner().invoke(app, ["cancel", "j-1"])
    _assert_clean(out.output)
    assert "cancelled\\e]0;pwned\\a" in out.output


def test_error_lines_escape_control_characters(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from rlsched.cli import main
    from rlsched.errors import RlschedError

    def boom(server: Any, state_dir: Any) -> Any:
        raise RlschedError(f"unknown job 'j-{CLEAR}'")

    monkeypatch.setattr(service_cmd, "_client", boom)
    monkeypatch.setattr("sys.argv", ["rlsched", "status", "x"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err == "error: unknown job 'j-\\e[2J'\n"


def test_logs_to_a_terminal_are_escaped_and_to_a_pipe_byte_for_byte() -> None:
    data = f"step 1\r\nprogress{ESC_TITLE} ok\tdone\n".encode() + "é".encode()
    tty = io.BytesIO()
    w = LogWriter(tty, escape=True)
    w.write(data[:-1])  # a chunk boundary inside a UTF-8 character
    w.write(data[-1:], final=True)
    assert tty.getvalue().decode() == "step 1\r\nprogress\\e]0;pwned\\a ok\tdone\né"
    pipe = io.BytesIO()
    LogWriter(pipe, escape=False).write(data, final=True)
    assert pipe.getvalue() == data


def test_logs_command_writes_raw_bytes_to_a_pipe(fake: FakeClient) -> None:
    fake.log = b"\x1b[31mred\x1b[0m\n"
    out = CliRunner().invoke(app, ["logs", "j-1"])
    assert out.exit_code == 0
    assert out.stdout_bytes == fake.log  # not a terminal: exactly what the job wrote


@pytest.mark.parametrize("columns", [80, 100, 160, 240])
def test_uuids_are_never_split_and_tables_fit_the_terminal(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    for table in (status_table(_jobs(), now=NOW), audit_table(_audit())):
        console = output_console(file=io.StringIO(), force_terminal=False)
        assert console.width == columns
        console.print(table, crop=False)
        text = console.file.getvalue()  # type: ignore[attr-defined]
        lines = text.splitlines()
        shown = [u for u in [*UUIDS, MIG] if any(u in line for line in lines)]
        expected = UUIDS + ([MIG] if table.columns[0].header == "JOB" else [])
        assert shown == expected, text
        if columns >= 120:  # narrower, a row of four whole UUIDs and these long words cannot fit
            assert max(len(line) for line in lines) <= columns, text


def test_age_is_time_since_submission_and_runtime_the_last_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    console = output_console(file=io.StringIO())
    console.print(status_table(_jobs(), now=NOW), crop=False)
    rows = {line.split()[0]: line for line in console.file.getvalue().splitlines()}  # type: ignore[attr-defined]
    assert re.search(r"\b10m00s\s+5m00s\b", rows["j-1"])  # running: submitted 10 min ago, running for 5
    assert re.search(r"\b2m00s\s+-\s", rows["j-2"])  # queued: never started
    assert re.search(r"\b2h00m\s+1m40s\b", rows["j-3"])  # done: ran 100 s, submitted 2 h ago


def test_inventory_show_escapes_node_names(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    fleet = tmp_path / "fleet.json"
    init = CliRunner().invoke(app, ["inventory", "init", "--nodes", "1x2xH100-80GB", "--out", str(fleet)])
    assert init.exit_code == 0, init.output
    doc = json.loads(fleet.read_text())
    doc["nodes"][0]["hostname"] = f"evil{ESC_TITLE}[red]"
    fleet.write_text(json.dumps(doc))
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["inventory", "show", "--backend", f"sim:{fleet}"])
    assert out.exit_code == 0, out.output
    _assert_clean(out.output)
    assert "evil\\e]0;pwned\\a[red]" in out.output


def test_a_real_service_never_echoes_a_jobs_escape_sequences(tmp_path: Any) -> None:
    """End to end: an argv with escapes goes into the service and comes back escaped from every listing (the
    service itself refuses a user name with control characters)."""
    import json as _json
    import sys

    from service.serving import start_serve, wait_for, write_workspace

    spec, fleet = write_workspace(tmp_path)
    s = start_serve(spec, fleet, tmp_path / "state")
    try:
        sub = s.cli("submit", "--gpus", "1", "--", sys.executable, "-c", "print('ok')", f"arg{ESC_TITLE}{CLEAR}")
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.strip()

        def done() -> bool:
            return _json.loads(s.cli("status", job, "--json").stdout)["state"] == "done"

        wait_for(done, what="the job to finish")
        for args in (("status",), ("status", job), ("audit", "--job", job), ("status", "--all")):
            p = s.cli(*args, COLUMNS="160")
            assert p.returncode == 0, p.stderr
            _assert_clean(p.stdout + p.stderr)
        assert "$'arg\\e]0;pwned\\a\\e[2J'" in s.cli("status", job).stdout
    finally:
        assert s.stop() == 0


def test_plan_apply_and_state_escape_names_from_the_spec_and_backend(tmp_path: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    host = f"evil{ESC_TITLE}"
    fleet = tmp_path / "fleet.json"
    init = CliRunner().invoke(app, ["inventory", "init", "--nodes", "1x2xH100-80GB", "--out", str(fleet)])
    assert init.exit_code == 0, init.output
    doc = json.loads(fleet.read_text())
    doc["nodes"][0]["hostname"] = host
    fleet.write_text(json.dumps(doc))
    spec = tmp_path / "pool.hcl"
    spec.write_text(f'pool "p" {{\n  gpu_model = "H100-80GB"\n  capacity  = "on_prem"\n  nodes     = ["{host}"]\n}}\n')
    monkeypatch.chdir(tmp_path)
    backend = ["--backend", f"sim:{fleet}"]
    for args in (["plan", "pool.hcl", *backend], ["apply", "pool.hcl", "--auto-approve", "--no-serve", *backend],
                 ["state", "list"], ["state", "show", f"node.{host}"]):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 0, (args, out.output)
        _assert_clean(out.output)
        assert "evil\\e]0;pwned\\a" in out.output, (args, out.output)
