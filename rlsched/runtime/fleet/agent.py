"""The node agent: the only code that touches one machine's GPUs and job processes for the service.

One agent runs per Ray node, as a detached actor pinned to it (:mod:`~rlsched.runtime.fleet.directory`
creates it). It wraps that node's GPU backend - NVML on a GPU machine, or a simulated fleet file for
tests and benchmarks - and a :class:`~rlsched.runtime.executor.LocalExecutor` whose job processes run
under the same exit-recording wrapper as on a one-machine service. The service stays the only
decision-maker: the agent never places, queues or retries anything, it does what it is told and reports.
Job processes are detached from the agent (``LocalExecutor(detach=True)``): Ray kills a worker's children
when the worker exits, and jobs must outlive a dead agent or raylet, to be re-adopted or fenced.

Configuration comes from the node's environment (``ray start`` passes its environment to the agent):

* ``RLSCHED_AGENT_BACKEND``: ``nvml`` (default), ``sim:PATH.json`` (a simulated fleet; every node of
  the file is this agent's - give each Ray node its own file) or ``none`` (a node without GPUs for
  rlsched, e.g. a CPU-only head: the agent manages nothing and reports no problem);
* ``RLSCHED_AGENT_STATE_DIR``: where job logs, exit files and the agent's job table live (default
  ``~/.local/state/rlsched/agent``); it must survive the agent, so a restarted agent re-adopts the jobs;
* ``RLSCHED_AGENT_HOSTNAME``: the node's name with the ``nvml`` backend (default the machine's hostname):
  the name pools list in ``nodes = [...]``.

**Fencing.** A service that dies with a launch still on its way to an agent must not have that launch
run after its successor has looked for the job, found nothing and requeued it: the job would run twice.
Every service takes an *epoch* when it starts (:meth:`NodeAgent.claim`, on every agent, before it
recovers a single job) and sends it with each launch; an agent refuses a launch whose epoch is below the
highest it was claimed with, and keeps that number across its own restarts (``epoch`` in its state dir).
A claim and a launch never interleave (both hold the agent's lock), so either the late launch came first
(the successor finds its process and adopts it) or the claim did (the launch is refused and starts nothing). A zombie
service that lost its lease is fenced the same way.

This class imports no Ray: the directory wraps it as an actor, and tests can drive it directly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.posix import atomic_write
from rlsched.runtime.backend import BackendError, GpuBackend, GpuInfo, NodeInfo
from rlsched.runtime.executor import EXIT_LOST, ExecutorError, Launched, LocalExecutor, private_dir

LOG = logging.getLogger(__name__)

BACKEND_ENV = "RLSCHED_AGENT_BACKEND"
STATE_DIR_ENV = "RLSCHED_AGENT_STATE_DIR"
HOSTNAME_ENV = "RLSCHED_AGENT_HOSTNAME"
#: Bytes of a job's log one :meth:`NodeAgent.read_log` call returns at most.
LOG_CHUNK = 1 << 20


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/rlsched/agent`` (``~/.local/state/rlsched/agent``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rlsched" / "agent"


def open_backend(spec: str, hostname: str) -> GpuBackend:
    """The agent's GPU backend: ``nvml`` (this machine, named ``hostname``) or ``sim:PATH``.

    Raises:
        BackendError: another form, a missing fleet file, or NVML not available on this node.
    """
    if spec == "nvml":
        from rlsched.runtime.nvml_backend import NvmlBackend

        return NvmlBackend(hostname=hostname)
    if spec.startswith("sim:") and spec[4:]:
        from rlsched.runtime.sim_backend import SimulatedBackend

        return SimulatedBackend(spec[4:])
    raise BackendError(f"{BACKEND_ENV}={spec!r}: expected 'nvml', 'sim:PATH.json' or 'none'")


@dataclass(frozen=True)
class JobLaunch:
    """What to start for one job on one node: its command, the devices it sees, extra environment, directory."""

    argv: tuple[str, ...]
    devices: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


class NodeAgent:
    """Inventory, GPU control and job processes of one Ray node (see the module doc).

    Every call is safe from several threads (the actor runs calls concurrently, so a slow MIG change
    never holds up a poll). A backend that fails to open (no NVML on this node) leaves the agent up:
    :meth:`hello` reports the error and every GPU call raises it, so the service shows the node as
    unknown with the reason instead of losing the whole fleet.
    """

    def __init__(self, backend: str | None = None, state_dir: str | None = None, hostname: str | None = None) -> None:
        self.spec = backend or os.environ.get(BACKEND_ENV) or "nvml"
        self.hostname = hostname or os.environ.get(HOSTNAME_ENV) or socket.gethostname()
        self.state_dir = private_dir(state_dir or os.environ.get(STATE_DIR_ENV) or default_state_dir())
        self._lock = threading.RLock()
        #: node -> the executor of its jobs (see :meth:`_executor`)
        self._executors: dict[str, LocalExecutor] = {}
        self._table_path = self.state_dir / "jobs.json"
        #: (node, job id) -> every process this agent started or adopted and not yet seen end
        self._jobs: dict[tuple[str, str], Launched] = self._load_table()
        self._epoch_path = self.state_dir / "epoch"
        #: the highest service epoch this agent was claimed with (see the module doc)
        self._epoch = self._load_epoch()
        self.error = ""
        self._backend: GpuBackend | None = None
        if self.spec != "none":
            try:
                self._backend = open_backend(self.spec, self.hostname)
            except BackendError as exc:
                self.error = str(exc)

    # ------------------------------------------------------------------ identity
    def hello(self) -> dict[str, Any]:
        """Who this agent is: its nodes, backend, pid, state dir, and the backend's error if it has one."""
        hosts: list[str] = []
        error = self.error
        if self._backend is not None:
            try:
                hosts = [n.hostname for n in self._backend.inventory()]
            except BackendError as exc:
                error = str(exc)
        elif self.spec == "nvml":
            hosts = [self.hostname]
        return {"hosts": hosts, "backend": self.spec, "error": error, "pid": os.getpid(),
                "state_dir": str(self.state_dir), "machine": socket.gethostname(), "epoch": self._epoch}

    def claim(self, epoch: int) -> int:
        """Answer to services of ``epoch`` or later from now on (never lowers it); the epoch now in force.

        A service calls it on every agent when it starts, before it recovers any job: from then on a launch
        its dead predecessor still had on the way is refused (module doc).
        """
        with self._lock:
            if epoch > self._epoch:
                self._epoch = int(epoch)
                atomic_write(self._epoch_path, str(self._epoch), mode=0o600, durable=True)
            return self._epoch

    def _gpus(self) -> GpuBackend:
        if self._backend is None and self.spec == "none":
            raise BackendError(f"node {self.hostname}: {BACKEND_ENV}=none (no GPUs managed here)")
        if self._backend is None:
            raise BackendError(f"node {self.hostname}: {self.error}")
        return self._backend

    # ------------------------------------------------------------------ GPUs (the GpuBackend calls)
    def inventory(self) -> list[NodeInfo]:
        """Every node of this agent's backend (none for ``RLSCHED_AGENT_BACKEND=none``)."""
        return [] if self.spec == "none" else list(self._gpus().inventory())

    def node(self, hostname: str) -> NodeInfo:
        return self._gpus().node(hostname)

    def cordon(self, hostname: str, on: bool) -> None:
        self._gpus().cordon(hostname, on)

    def running_jobs(self, hostname: str) -> int:
        """Job processes alive on ``hostname`` (what a drain waits for) plus what the backend counts."""
        mine = sum(1 for node, *_ in self.jobs() if node == hostname)
        return mine + self._gpus().running_jobs(hostname)

    def set_mig_mode(self, hostname: str, gpu_uuid: str, enabled: bool) -> None:
        self._gpus().set_mig_mode(hostname, gpu_uuid, enabled)

    def set_mig_layout(self, hostname: str, gpu_uuid: str, devices: Mapping[str, int]) -> GpuInfo:
        return self._gpus().set_mig_layout(hostname, gpu_uuid, dict(devices))

    def telemetry(self) -> list[dict[str, Any]]:
        read = getattr(self._gpus(), "telemetry", None)
        return list(read()) if callable(read) else []

    def health_events(self, timeout_ms: int = 0) -> list[tuple[str, str]]:
        read = getattr(self._gpus(), "health_events", None)
        return list(read(timeout_ms)) if callable(read) else []

    # ------------------------------------------------------------------ jobs
    def _executor(self, hostname: str) -> LocalExecutor:
        """The executor of one node's jobs: its own log and exit-file directory, so two nodes of one agent
        (a simulated fleet) never share a job's files."""
        with self._lock:
            ex = self._executors.get(hostname)
            if ex is None:
                ex = self._executors[hostname] = LocalExecutor(self.state_dir / "logs" / hostname, detach=True)
            return ex

    def _devices_of(self, hostname: str) -> set[str]:
        node = self._gpus().node(hostname)
        return {g.uuid for g in node.gpus} | {d.uuid for g in node.gpus for d in g.mig_devices}

    def launch(self, hostname: str, job_id: str, argv: Sequence[str], devices: Sequence[str],
               env_extra: Mapping[str, str] | None = None, cwd: str | None = None) -> tuple[Launched, int | None]:
        """:meth:`start` without an epoch (epoch 0): the call of services that predate fencing, refused once
        a fencing service has claimed this agent."""
        return self.start(hostname, job_id, JobLaunch(tuple(argv), tuple(devices), dict(env_extra or {}), cwd))

    def start(self, hostname: str, job_id: str, run: JobLaunch, epoch: int = 0) -> tuple[Launched, int | None]:
        """Start a job on ``hostname`` with exactly ``run.devices`` visible; refuses a device that is not there,
        and a launch from a service older than the one that last claimed this agent (``epoch``; module doc).

        Returns the handle and the pid of an older process of the same job it killed first (else None): the
        service launches a job only once it holds no other process of it, so such a process is a stray of
        an attempt that was requeued while this node was away.

        Raises:
            ExecutorError: a device of another node (or none of this agent's), a bad argv / job id, or a launch
                from a replaced service.
        """
        foreign = sorted(set(run.devices) - self._devices_of(hostname))
        if foreign:
            raise ExecutorError(f"node {hostname} has no device {', '.join(foreign)}")
        ex = self._executor(hostname)
        superseded = None
        with self._lock:
            if epoch < self._epoch:
                raise ExecutorError(f"launch of job {job_id} on {hostname} refused: it comes from a service that has "
                                    f"been replaced (epoch {epoch}; this node answers to epoch {self._epoch})")
            self.claim(epoch)
            old = self._jobs.get((hostname, job_id))
            if old is not None and ex.poll(old) is None:
                ex.send_signal(old, signal.SIGKILL)
                superseded = old.pid
            h = ex.launch(job_id, run.argv, run.devices, run.env, run.cwd)
            h = Launched(job_id, h.pid, h.start_time, h.log_path, h.exit_file, hostname)
            self._jobs[(hostname, job_id)] = h
            self._save_table()
        return h, superseded

    def _known(self, hostname: str, job_id: str, pid: int) -> Launched | None:
        h = self._jobs.get((hostname, job_id))
        return h if h is not None and h.pid == pid else None

    def adopt(self, hostname: str, job_id: str, pid: int, start_time: int) -> Launched | None:
        """Re-attach to a job's process (pid AND start time, and it is one of our wrappers); None if gone."""
        with self._lock:
            known = self._known(hostname, job_id, pid)
            if known is not None and known.start_time == start_time:
                return known
            h = self._executor(hostname).adopt(pid, start_time, None, job_id)
            if h is None:
                return None
            h = Launched(job_id, h.pid, h.start_time, h.log_path, h.exit_file, hostname)
            self._jobs[(hostname, job_id)] = h
            self._save_table()
            return h

    def find(self, hostname: str, job_id: str) -> Launched | None:
        """A live process of ``job_id`` (from the table, else a wrapper found among this node's processes)."""
        ex = self._executor(hostname)
        with self._lock:
            known = self._jobs.get((hostname, job_id))
            if known is not None and ex.poll(known) is None:
                return known
            h = ex.find(job_id)
            return None if h is None else self.adopt(hostname, job_id, h.pid, h.start_time)

    def poll(self, hostname: str, job_id: str, pid: int, start_time: int) -> int | None:
        """The exit code of that process of ``job_id``, or None while it runs."""
        ex = self._executor(hostname)
        with self._lock:
            h = self._known(hostname, job_id, pid)
            if h is None:
                h = ex.adopt(pid, start_time, None, job_id)
                if h is None:  # gone (or never ours): what its wrapper recorded, if anything
                    rc = ex.recorded_exit(job_id)
                    return rc if rc is not None else EXIT_LOST
            rc = ex.poll(h)
            if rc is not None and self._known(hostname, job_id, pid) is not None:
                del self._jobs[(hostname, job_id)]
                self._save_table()
            return rc

    def signal(self, hostname: str, job_id: str, pid: int, start_time: int, signum: int) -> None:
        """Signal the job's process group (a no-op once it is gone or its pid was recycled)."""
        ex = self._executor(hostname)
        h = ex.adopt(pid, start_time, None, job_id)
        if h is not None:
            ex.send_signal(h, signal.Signals(signum))

    def fence(self, hostname: str, job_id: str, pid: int) -> bool:
        """SIGKILL a stray process of ``job_id`` (one the service no longer runs here); whether one was."""
        with self._lock:
            known = self._known(hostname, job_id, pid)
            if known is None:
                return False
            self._executor(hostname).send_signal(known, signal.SIGKILL)
            return True

    def jobs(self) -> list[tuple[str, str, int, int]]:
        """``(node, job id, pid, start time)`` of every job process alive here (ended ones leave the table)."""
        with self._lock:
            alive, ended = [], []
            for (node, job_id), h in self._jobs.items():
                if self._executor(node).poll(h) is None:
                    alive.append((node, job_id, h.pid, h.start_time))
                else:
                    ended.append((node, job_id))
            if ended:
                for key in ended:
                    del self._jobs[key]
                self._save_table()
            return alive

    def recorded_exit(self, hostname: str, job_id: str) -> int | None:
        return self._executor(hostname).recorded_exit(job_id)

    def consume_exits(self, hostname: str, job_id: str, known: str | None = None) -> None:
        self._executor(hostname).consume_exits(job_id, Path(known) if known else None)

    def read_log(self, hostname: str, job_id: str, offset: int, limit: int = LOG_CHUNK) -> bytes:
        """Up to ``limit`` bytes of the job's log on ``hostname`` from ``offset`` (b"" at the end or if none)."""
        path = self._executor(hostname).log_dir / f"{job_id}.log"
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def read_logs(self, wanted: list[tuple[str, str, int]], limit: int = LOG_CHUNK) -> list[bytes]:
        """:meth:`read_log` for many ``(node, job id, offset)`` at once (one call per agent per copy round)."""
        return [self.read_log(node, job_id, offset, limit) for node, job_id, offset in wanted]

    # ------------------------------------------------------------------ the table
    def _load_epoch(self) -> int:
        """The epoch kept in the state dir; 0 when there is none. An unreadable one reads 0 too - harmless
        while every service claims the agents before it recovers a job (the claim writes a good one) - but
        it is said in the agent's log, since until then a replaced service's launch would not be refused."""
        try:
            return max(int(self._epoch_path.read_text().strip()), 0)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            LOG.warning("%s: unreadable service epoch (%s); launches are not fenced until a service claims "
                        "this agent", self._epoch_path, exc)
            return 0

    def _load_table(self) -> dict[tuple[str, str], Launched]:
        try:
            raw = json.loads(self._table_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        out: dict[tuple[str, str], Launched] = {}
        for e in raw if isinstance(raw, list) else ():
            try:
                node, job_id = str(e["node"]), str(e["job"])
                out[(node, job_id)] = Launched(job_id, int(e["pid"]), int(e["start_time"]), Path(e["log_path"]),
                                               Path(e["exit_file"]), node)
            except (KeyError, TypeError, ValueError):
                continue  # one bad entry never costs the others
        return out

    def _save_table(self) -> None:
        data = [{"node": node, "job": job_id, "pid": h.pid, "start_time": h.start_time, "log_path": str(h.log_path),
                 "exit_file": str(h.exit_file)} for (node, job_id), h in sorted(self._jobs.items())]
        # Not durable: the processes it lists die with the machine, and a rename is atomic against a crash
        # of the agent; an fsync per launch was most of a launch's time.
        atomic_write(self._table_path, json.dumps(data), mode=0o600, durable=False)
