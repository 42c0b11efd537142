"""Every command in the README's ``bash`` blocks works as written, or says which test covers it.

A README command that silently broke (the trained-model command once ran for 45 minutes) is what a
new user meets first. This test extracts every command from the README's ``bash`` code blocks and
holds each to one entry of :data:`PLAN`:

* ``run`` - run as written (in a scratch directory that mirrors the repository, so relative paths
  and ``../shared/data`` resolve and outputs land outside the checkout) within a time budget; it
  must exit 0 without a traceback. ``run`` with ``extra`` appends flags that only shrink the work
  (fewer jobs or windows), named in the entry.
* ``covered`` - exercised by the named tests (a service flow, a registry, a GPU), which must exist;
* ``skip`` - cannot run here, with the reason (installs, the whole suite, 20-minute trainings).

A command the table does not know fails the test: adding one to the README means saying how it is
checked. Commands that need files the repository does not ship (``TRACE.csv``) get a stand-in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SHARED = ROOT.parent / "shared"


def readme_commands(text: str = README) -> list[str]:
    """The commands of the ``bash`` blocks: continuation lines joined, comments and blank lines dropped."""
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        cmd = ""
        for line in block.splitlines():
            cmd = f"{cmd} {line.strip()}" if cmd else line.strip()
            if cmd.endswith("\\"):
                cmd = cmd[:-1].rstrip()
                continue
            if cmd and not cmd.startswith("#"):
                out.append(_strip_comment(cmd))
            cmd = ""
    return out


def _strip_comment(cmd: str) -> str:
    """``cmd`` without a trailing ``# comment`` (a ``#`` inside quotes is kept)."""
    idx = cmd.find(" #")
    while idx != -1:
        head = cmd[:idx]
        if head.count('"') % 2 == 0 and head.count("'") % 2 == 0:
            return head.rstrip()
        idx = cmd.find(" #", idx + 1)
    return cmd


@dataclass(frozen=True)
class Entry:
    """How one README command is checked (see the module docstring)."""

    how: str  # run | covered | skip
    why: str = ""
    budget_s: float = 300.0
    extra: str = ""
    needs_shared: bool = False


#: ``(regex matched against the whole command, entry)``, first match wins.
PLAN: list[tuple[str, Entry]] = [
    (r"pip install -e \. && rlsched simulate --plot simulate\.png --json simulate\.json$",
     Entry("run", "the Quickstart: the main job on embedded defaults", 600)),
    (r"pip install torch==2\.13\.0 -e \"\.\[train,test\]\" && lint-imports && python -m pytest -n auto$",
     Entry("skip", "the CI command itself (.ci/run runs it)")),
    (r"pip install torch==2\.13\.0 --index-url https://download\.pytorch\.org/whl/cpu$",
     Entry("skip", "needs the PyTorch index, which this machine cannot reach")),
    (r"pip install -e \"\.\[train,test\]\" && lint-imports && python -m pytest -n auto$",
     Entry("skip", "the test suite itself")),
    (r"rlsched simulate --trace \.\./shared/data/philly-2017/philly_jobs\.csv --cluster 60x8xV100-16GB .*",
     Entry("run", "the full trace takes minutes per policy; the first 3000 jobs show the command works", 300,
           "--max-jobs 3000", needs_shared=True)),
    (r"rlsched simulate --scenario envs/hybrid-openb-mig\.yaml --policy spot-fallback --load-factor 0\.9$",
     Entry("run", "", 300)),
    (r"rlsched policies$", Entry("run", "", 60)),
    (r"rlsched trace info TRACE\.csv$", Entry("run", "TRACE.csv stands for the user's trace: the bundled sample", 60)),
    (r"rlsched trace convert \.\./shared/data/alibaba-gpu-v2023/openb_pod_list_default\.csv openb\.csv$",
     Entry("run", "", 120, needs_shared=True)),
    (r"rlsched market convert --source gcp .*", Entry("run", "", 120, needs_shared=True)),
    (r"rlsched serve configs/local\.hcl --backend nvml$",
     Entry("covered", "needs an NVIDIA GPU; the service over the simulated fleet and the NVML backend over the "
           "fake pynvml are tested", extra="tests/service/test_service_basic.py tests/runtime/test_nvml_backend.py")),
    (r"rlsched apply pool\.hcl$", Entry("covered", "apply starting and hot-reloading the service",
                                         extra="tests/service/test_service_policy.py tests/plan/test_apply.py")),
    (r"(JOB=\$\()?rlsched (submit|status|logs|cancel|audit)\b.*",
     Entry("covered", "the client against a real service", extra="tests/cli/test_service_cli.py")),
    (r"rlsched stop$", Entry("covered", "stopping the detached service", extra="tests/cli/test_service_cli.py")),
    (r"rlsched train experiments/smoke\.yaml$",
     Entry("covered", "trains, registers and serves through a real MLflow server",
           extra="tests/train/test_train_smoke.py")),
    (r"rlsched train experiments/(default|spot|selector)\.yaml( --resume)?$",
     Entry("skip", "trains a shipped model (9-30 min on 2 cores); the smoke experiment runs the same pipeline, "
                   "tests/train/test_selector_train.py a selector's")),
    (r"rlsched simulate --policy ppo:models/(default|scorer) --policy weighted-priority$",
     Entry("run", "the shipped models on the bundled fleet (the per-slot scorer once livelocked here)", 300)),
    (r"rlsched simulate --policy ppo:models:/rlsched-ppo@champion$",
     Entry("covered", "serving a registered model by alias", extra="tests/train/test_train_smoke.py")),
    (r"rlsched (promote|models gate) rlsched-ppo 3$",
     Entry("covered", "needs a registry with versions", extra="tests/train/test_registry.py")),
    (r"rlsched trace export --state-dir \.rlsched --since 7d --out jobs\.csv$",
     Entry("covered", "needs a service's history",
           extra="tests/cli/test_trace_export.py tests/train/test_retrain_e2e.py")),
    (r"rlsched advise --state-dir \.rlsched$",
     Entry("covered", "needs a service's history", extra="tests/service/test_twin.py tests/train/test_retrain_e2e.py")),
    (r"rlsched retrain --state-dir \.rlsched --from models:/rlsched-ppo@champion --days 7$",
     Entry("covered", "needs a service's history and a registry", extra="tests/train/test_retrain_e2e.py")),
    (r"rlsched trace generate --list$", Entry("run", "", 60)),
    (r"rlsched trace generate bursty --seed 3 --set load=1\.2 -o bursty\.csv$", Entry("run", "", 60)),
    (r"python benchmarks/generalisation\.py --model models/default --windows 12 --max-jobs 1500$",
     Entry("run", "the full run takes minutes; one small window of two families shows the command works", 300,
           "--families gen-light,philly-late --windows 1 --max-jobs 200", needs_shared=True)),
    (r"rlsched simulate --trace rlsched/data/traces/philly-3day\.csv --max-jobs 1000 .*ppo:models/spot$",
     Entry("run", "", 600)),
    (r"python benchmarks/cost_report\.py --ppo models/spot$",
     Entry("covered", "the full cost report takes ~10 min", extra="tests/benchmarks/test_cost_report_smoke.py")),
    (r"pip install \"rlsched\[fleet(,nvml)?\]\"$",
     Entry("skip", "the set-up of a real cluster's machines (the extras are installed by the test extra here)")),
    (r"(RLSCHED_AGENT_BACKEND=none|RLSCHED_AGENT_HOSTNAME=gpu-01) ray start .*",
     Entry("covered", "needs several machines; the same agent configuration through each Ray node's environment "
           "on a real multi-node cluster on one machine", extra="tests/runtime/fleet/test_ray_fleet.py")),
    (r"rlsched (plan|apply) pool\.hcl --backend ray:HEAD:6379$",
     Entry("covered", "HEAD stands for the user's Ray head; plan and apply through the agents",
           extra="tests/runtime/fleet/test_ray_fleet.py")),
    (r"rlsched submit --gpus 16 -- torchrun .*",
     Entry("covered", "a gang over two nodes with its rank variables", extra="tests/runtime/fleet/test_ray_fleet.py")),
    (r"rlsched train experiments/default\.yaml --ray (auto|10\.0\.0\.5:6379)$",
     Entry("covered", "trains a shipped model (minutes); a small training on Ray against the same one locally",
           extra="tests/train/test_ray_training.py")),
    (r"python benchmarks/generalisation\.py --model models/default --windows 4 --ray 10\.0\.0\.5:6379$",
     Entry("covered", "10.0.0.5 stands for the user's Ray head; the families evaluated on Ray equal the local run",
           extra="tests/train/test_ray_training.py")),
    (r"ruff check \. && mypy$", Entry("run", "lint and types", 600)),
    (r"lint-imports$", Entry("run", "the import layer contracts", 300)),
    (r"python -m pytest -n auto( -m \"not slow\")?$", Entry("skip", "the test suite itself")),
    (r"python benchmarks/replay\.py$",
     Entry("run", "a million-job replay takes minutes; the smallest size once shows the command works", 300,
           "--sizes 10000 --repeat 1")),
]


def plan_for(cmd: str) -> Entry | None:
    for pattern, entry in PLAN:
        if re.fullmatch(pattern, cmd):
            return entry
    return None


COMMANDS = readme_commands()


def test_the_readme_has_commands_and_each_is_planned() -> None:
    assert len(COMMANDS) >= 20
    unplanned = [c for c in COMMANDS if plan_for(c) is None]
    assert not unplanned, ("README commands nobody checks - add them to PLAN in tests/test_readme_commands.py: "
                           f"{unplanned}")
    for cmd in COMMANDS:
        entry = plan_for(cmd)
        assert entry is not None
        if entry.how == "covered":
            for test in entry.extra.split():
                assert (ROOT / test).is_file(), f"{cmd!r} is said to be covered by {test}, which does not exist"
        if entry.how == "skip":
            assert entry.why, f"{cmd!r} is skipped without a reason"


def test_the_extractor_joins_continuations_and_drops_comments() -> None:
    text = "x\n```bash\n# a comment\nrlsched simulate --a 1 \\\n    --b 2   # why\n\necho '# kept'\n```\n"
    assert readme_commands(text) == ["rlsched simulate --a 1 --b 2", "echo '# kept'"]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory laid out like the checkout (links to its folders) with ``../shared`` beside it."""
    base = tmp_path_factory.mktemp("readme")
    work = base / "main"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name in ("mlruns.db", "mlruns"):
            continue
        (work / entry.name).symlink_to(entry)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED)
    (work / "TRACE.csv").symlink_to(ROOT / "rlsched" / "data" / "traces" / "philly-3day.csv")
    return work


RUNNABLE = [c for c in COMMANDS if (e := plan_for(c)) is not None and e.how == "run"]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", RUNNABLE, ids=[c[:60] for c in RUNNABLE])
def test_readme_command_runs_as_written(cmd: str, scratch: Path) -> None:
    entry = plan_for(cmd)
    assert entry is not None
    if entry.needs_shared and not SHARED.is_dir():
        pytest.skip(f"needs {SHARED}")
    line = cmd
    if line.startswith("pip install -e . && "):
        line = line.removeprefix("pip install -e . && ")  # the package is installed: re-installing is pip's job
    if entry.extra:
        line = f"{line} {entry.extra}"
    env = dict(os.environ, COLUMNS="200", MLFLOW_TRACKING_URI=f"sqlite:///{scratch / 'mlruns.db'}",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("RLSCHED_BACKEND", None)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", line.replace("python ", f"{sys.executable} ", 1)
                           if line.startswith("python ") else line],
                          cwd=scratch, env=env, capture_output=True, text=True, timeout=entry.budget_s,
                          stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{line}` exited {proc.returncode} after {took:.0f} s:\n{out[-3000:]}"
    assert "Traceback" not in out, f"`{line}` printed a traceback:\n{out[-3000:]}"
