"""Helpers for the HTTP/CLI tests: a sim fleet + pool spec, ``rlsched serve`` in a subprocess, raw HTTP.

Everything goes through the real entry points: the service is ``python -m rlsched
serve`` listening on a free loopback port (``--listen 127.0.0.1:0``; the port is
read back from ``server.json``), and clients are ``python -m rlsched ...`` or
plain ``urllib`` requests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "rlsched"]

POOL_HCL = """
mig_layout "balanced" {
  devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }
}

pool "train" {
  gpu_model = "H100-80GB"
  nodes     = [%(train_nodes)s]
  mig       = "disabled"
}

pool "rollout" {
  gpu_model  = "H100-80GB"
  nodes      = ["%(mig_node)s"]
  mig_layout = mig_layout.balanced
}

quota "interns" {
  pool     = pool.train
  principal = "intern"
  max_gpus = 2
}

policy "default" {
  scheduler = "%(scheduler)s"
  fallback  = "fifo"
}
"""


def write_workspace(root: Path, *, train_nodes: int = 1, gpus_per_node: int = 4, scheduler: str = "fifo") -> tuple[
        Path, Path]:
    """(spec, fleet): ``train_nodes`` whole-GPU H100 nodes and one H100 node with 2 balanced-MIG GPUs."""
    from rlsched.runtime.sim_backend import build_fleet, write_json_atomic

    fleet = root / "fleet.json"
    data = build_fleet(f"{train_nodes}x{gpus_per_node}xH100-80GB,1x2xH100-80GB:balanced")
    write_json_atomic(fleet, data)
    hosts = [n["hostname"] for n in data["nodes"]]
    spec = root / "pool.hcl"
    spec.write_text(POOL_HCL % {"train_nodes": ", ".join(f'"{h}"' for h in hosts[:-1]), "mig_node": hosts[-1],
                                "scheduler": scheduler})
    return spec, fleet


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RLSCHED_BACKEND", "RLSCHED_SERVER", "RLSCHED_TOKEN")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Served:
    """A running ``rlsched serve``."""

    proc: subprocess.Popen[bytes]
    url: str
    state_dir: Path
    spec: Path
    fleet: Path
    log: Path

    @property
    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    def env(self, **extra: str) -> dict[str, str]:
        """Client environment pointing at this service, with its token (the state dir is not the default
        one beside the spec, so discovery would not find it; tests of discovery set up their own)."""
        return clean_env(**{"RLSCHED_SERVER": self.url, "RLSCHED_TOKEN": self.token, **extra})

    def cli(self, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, env=self.env(**env), timeout=timeout,
                              cwd=self.state_dir.parent)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"service did not stop on signal {sig}:\n{self.log_text()[-3000:]}") from None


def start_serve(spec: Path, fleet: Path, state_dir: Path, *extra: str, timeout: float = 120,
                log_name: str = "serve.log", umask: int | None = None, default_state_dir: bool = False) -> Served:
    """``rlsched serve`` on a free loopback port; returns once ``/healthz`` answers.

    ``umask``: the service's umask; ``default_state_dir``: pass no ``--state-dir`` (``state_dir`` must then be
    the spec's default one).
    """
    home = spec.parent if default_state_dir else state_dir.parent
    log = home / log_name
    home.mkdir(parents=True, exist_ok=True)
    argv = [*CLI, "serve", str(spec), "--backend", f"sim:{fleet}", "--listen", "127.0.0.1:0",
            *([] if default_state_dir else ["--state-dir", str(state_dir)]), "--tick-ms", "50", "--grace", "2",
            *extra]

    def set_umask() -> None:
        if umask is not None:
            os.umask(umask)

    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
                                cwd=home, start_new_session=True, preexec_fn=set_umask)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"rlsched serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError, ValueError):
            info = json.loads((state_dir / "server.json").read_text())
            if info.get("pid") == proc.pid:
                status, _, _ = http("GET", info["url"] + "/healthz")
                if status == 200:
                    return Served(proc, info["url"], state_dir, spec, fleet, log)
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"rlsched serve did not come up within {timeout} s:\n{log.read_text()[-3000:]}")


def http(method: str, url: str, *, token: str | None = None, body: Any = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, dict[str, str], bytes]:
    """One request; returns (status, lower-cased headers, body) for any status."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def detail(body: bytes) -> str:
    return str(json.loads(body)["detail"])


def wait_for(pred: Any, timeout: float = 120, interval: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
