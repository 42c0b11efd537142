"""``rlsched validate`` and ``rlsched fmt`` through a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.spec.conftest import ROOT, hcl_md_example


def _cmd() -> list[str]:
    commands = (ROOT / "rlsched" / "cli" / "commands.py").read_text()
    if "spec_cmd" in commands:
        return [sys.executable, "-m", "rlsched"]
    # until rlsched/cli/commands.py imports spec_cmd, register it by hand
    return [sys.executable, "-c", "import rlsched.cli.spec_cmd; from rlsched.cli import main; main()"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_VAR_")}
    return subprocess.run([*_cmd(), *args], capture_output=True, text=True, cwd=cwd or ROOT, env=env, timeout=120)


def test_validate_ok(tmp_path: Path) -> None:
    (tmp_path / "pool.hcl").write_text(hcl_md_example())
    res = run("validate", str(tmp_path / "pool.hcl"))
    assert res.returncode == 0, res.stderr
    assert "Success! The configuration is valid." in res.stdout
    assert "2 pools" in res.stdout


def test_validate_summary_names_a_non_default_gang_mode(tmp_path: Path) -> None:
    pool = 'pool "p" {\n  gpu_model = "H100"\n  nodes     = ["a"]\n%s}\n'
    (tmp_path / "pool.hcl").write_text(pool % '  gang      = "packed"\n')
    res = run("validate", str(tmp_path / "pool.hcl"))
    assert res.returncode == 0, res.stderr
    assert "on_prem, gang packed)" in res.stdout
    (tmp_path / "pool.hcl").write_text(pool % "")
    assert "gang" not in run("validate", str(tmp_path / "pool.hcl")).stdout


def test_validate_json_invalid(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hcl"
    bad.write_text('pool "a" {\n  gpu_model = "H100"\n  nodes = ["n"]\n  nodes = ["m"]\n}\n')
    res = run("validate", "--json", str(bad))
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert doc["valid"] is False and doc["error_count"] == 1 and doc["warning_count"] == 0
    d = doc["diagnostics"][0]
    assert d["severity"] == "error" and d["summary"] == "Attribute redefined"
    assert d["range"]["filename"] == str(bad) and d["range"]["start"] == {"line": 4, "column": 3}


def test_validate_text_has_caret_and_var_order(tmp_path: Path) -> None:
    spec = tmp_path / "v.hcl"
    spec.write_text('variable "n" {\n  type = number\n}\npool "a" {\n  gpu_model = "H100"\n  capacity = "spot"\n'
                    '  node_count = var.n\n}\n')
    res = run("validate", str(spec))  # as Terraform: the configuration is valid without a value for n
    assert res.returncode == 0 and "var.n" in res.stdout and "? nodes" in res.stdout, res.stdout + res.stderr
    vf = tmp_path / "x.rlvars"
    vf.write_text("n = 0\n")
    assert run("validate", str(spec), "--var", "n=0", "--var-file", str(vf)).returncode == 1
    res = run("validate", str(spec), "--var-file", str(vf), "--var", "n=2")
    assert res.returncode == 0, res.stderr
    res = run("validate", str(spec), "--var", "n=2", "--var-file", str(vf))
    assert res.returncode == 1 and "^" in res.stderr  # the file's 0 wins and is pointed at


def test_fmt_check_and_write(tmp_path: Path) -> None:
    f = tmp_path / "a.hcl"
    f.write_text('pool "a" {\ngpu_model="H100" # c\n}\n')
    res = run("fmt", "--check", str(f))
    assert res.returncode == 3 and str(f) in res.stdout
    assert run("fmt", str(f)).returncode == 0
    assert f.read_text() == 'pool "a" {\n  gpu_model = "H100" # c\n}\n'
    assert run("fmt", "--check", str(f)).returncode == 0
    bad = tmp_path / "b.hcl"
    bad.write_text('pool "a" {\n')
    res = run("fmt", str(bad))
    assert res.returncode == 1 and bad.read_text() == 'pool "a" {\n'


def test_validate_does_not_import_heavy_modules() -> None:
    code = ("import sys; from pathlib import Path; from rlsched.spec import load_spec; "
            "load_spec(Path('configs/hybrid-spot.hcl'), env={}); "
            "print(sorted(m for m in ('torch', 'mlflow', 'pynvml') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.stdout.strip() == "[]", res.stderr
