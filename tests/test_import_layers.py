"""The import layers hold: ``lint-imports`` keeps every contract in pyproject.toml's ``[tool.importlinter]``.

``.ci/run`` runs ``lint-imports`` too; this test makes a local ``pytest`` run catch a broken layer
(a heuristic importing the simulator, the simulator importing a policy, ...) before CI does. It also
holds the contract to the package: every top-level module of ``rlsched`` has its place in the layers,
so a new package cannot sit outside them unchecked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
#: Entry points and data, not layers: ``python -m rlsched`` only calls the CLI; ``data`` holds no code.
NOT_LAYERED = {"__main__", "data"}


def _layers() -> list[list[str]]:
    contract = next(c for c in CONFIG["contracts"] if c["type"] == "layers" and "containers" not in c)
    return [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]


def test_every_top_level_module_has_a_layer() -> None:
    named = {m.removeprefix("rlsched.") for layer in _layers() for m in layer}
    present = {p.stem for p in (ROOT / "rlsched").glob("*.py") if p.stem != "__init__"}
    present |= {p.name for p in (ROOT / "rlsched").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert present - NOT_LAYERED <= named, f"not in any layer of [tool.importlinter]: {sorted(present - named)}"
    assert named <= present, f"layers name modules that do not exist: {sorted(named - present)}"


def test_lint_imports_keeps_every_contract() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    res = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"lint-imports found broken contracts:\n{res.stdout[-4000:]}{res.stderr[-2000:]}"
    assert f"Contracts: {len(CONFIG['contracts'])} kept, 0 broken." in res.stdout
