"""Fixtures of the training/registry tests: a real MLflow server and smoke model folders.

The server is a genuine ``mlflow server`` subprocess (SQLite backend, proxied
artifacts) on a free local port, started once per session (per xdist worker) and
killed with its whole process group at the end - the registry code is tested
against the same REST API production uses, not an in-process store. Fixtures that
need MLflow skip cleanly when it is not installed (the ``train`` extra).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: Environment every MLflow-using test and the server run with: no telemetry, no
#: background job runner (it forks a dozen consumers and slows start-up).
QUIET_MLFLOW_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}
SERVER_START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the server and the workers it spawned (its own process group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real ``mlflow server`` (SQLite backend, ``--serve-artifacts``) for this session."""
    pytest.importorskip("mlflow")
    exe = shutil.which("mlflow")
    cmd = [exe] if exe else [sys.executable, "-m", "mlflow"]
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*cmd, "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **QUIET_MLFLOW_ENV},
            start_new_session=True, cwd=root,
        )
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(f"mlflow server did not come up on {url} (exit {proc.poll()}):\n{tail}")
            time.sleep(0.25)
        yield url
    finally:
        _stop(proc)


@pytest.fixture
def quiet_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """No telemetry from in-process MLflow."""
    for k, v in QUIET_MLFLOW_ENV.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def registry(mlflow_server: str, quiet_mlflow: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """The session server as this test's tracking URI, run from a scratch directory.

    The scratch directory keeps the default audit file and the model cache out of
    the checkout and the home directory; any run a test leaves active is ended.
    """
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("RLSCHED_MODEL_CACHE", str(tmp_path / "model-cache"))
    monkeypatch.delenv("RLSCHED_AUDIT_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    yield mlflow_server
    while mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.fixture
def model_name() -> str:
    """A registered-model name unique to the test (the server is shared by the session)."""
    return f"policy-{uuid.uuid4().hex[:10]}"


#: A workload-family evaluation the candidate passes (0.99x the best heuristic on an unseen family).
PASSING_FAMILIES: dict[str, Any] = {
    "summary": {"gen-steady": {"windows": 3, "best": "sjf", "best_vs_wp": 0.97, "bound_vs_wp": 0.9,
                               "model_vs_best": 0.99, "model_vs_wp": 0.96}},
    "exposure": {"gen-steady": "unseen"},
}


def eval_card(ppo: tuple[float, float], wp: tuple[float, float] = (7200.0, 100.0), completed: float = 50.0,
              eval_set: str | None = None, families: dict[str, Any] | None = PASSING_FAMILIES) -> dict[str, Any]:
    """A model card whose evaluation has ``ppo`` and weighted-priority (mean JCT s, cost USD).

    ``families`` is its workload-family evaluation (None: the card has none).
    """
    card: dict[str, Any] = {
        "name": "smoke",
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "scenarios": [{"name": "philly-smoke"}],
        "metrics": {"eval": {
            "ppo": {"mean_jct_s": ppo[0], "cost_usd": ppo[1], "jobs_completed": completed, "p95_jct_s": 2 * ppo[0]},
            "weighted-priority": {"mean_jct_s": wp[0], "cost_usd": wp[1], "jobs_completed": completed},
            "fifo": {"mean_jct_s": 9000.0, "cost_usd": 100.0, "jobs_completed": completed},
        }},
    }
    if eval_set is not None:
        card["eval_set"] = eval_set
    if families is not None:
        card["metrics"]["families"] = families
    return card


@pytest.fixture
def smoke_model(tmp_path: Path) -> Callable[..., Path]:
    """Factory: an untrained (random-weight) model folder with a given evaluation card.

    ``smoke_model(ppo=(jct_s, cost), wp=(jct_s, cost), seed=0, name="m")``.
    """
    pytest.importorskip("torch")
    pytest.importorskip("sb3_contrib")

    def make(ppo: tuple[float, float] = (3600.0, 90.0), wp: tuple[float, float] = (7200.0, 100.0), *, seed: int = 0,
             name: str | None = None, **card_kw: Any) -> Path:
        import torch

        from rlsched.envs.codec import ObservationCodec
        from rlsched.learned.ppo import PolicyModel
        from rlsched.learned.ppo_net import SlotScorer

        torch.manual_seed(seed)
        codec = ObservationCodec()
        folder = tmp_path / (name or f"model-{uuid.uuid4().hex[:6]}")
        return PolicyModel.save(folder, SlotScorer(codec.observation_space), codec, eval_card(ppo, wp, **card_kw))

    return make
