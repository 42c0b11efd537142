"""The service's job executor over a Ray cluster's node agents.

:class:`RayExecutor` implements :class:`~rlsched.runtime.job_executor.JobExecutor`: a launch goes to the
agent of the node the scheduler chose (:meth:`RayExecutor.on`), which starts the job under the usual
wrapper with ``CUDA_VISIBLE_DEVICES`` set to the allocated UUIDs; polls, signals and exit records go to
the agent of the handle's node. What it adds over the local executor:

* **Gangs span nodes.** A job whose devices are on several nodes (a multi-node gang) starts one process
  per node, each seeing only that node's devices, with ``RLSCHED_GANG_RANK`` / ``_SIZE`` / ``_HOSTS`` /
  ``_LEADER`` set (what ``torchrun --node_rank`` needs). The store keeps the leader's (rank 0) pid; the job
  ends with its last rank, holding every node's GPUs until then. A member that fails stops the leader;
  members still running when the leader ended get :data:`GANG_GRACE_S` to finish (none if it failed), then
  SIGTERM, then SIGKILL after as long again. The exit code is the leader's, else the first failed
  member's. Members' output goes to the job's log, each line marked with its rank and node.
* **Logs come home.** A background thread copies each live job's new output from its agent into the
  service's own log file (``rlsched logs --follow`` reads that file), and a job's last bytes are copied
  before its exit is reported. Copy offsets are persisted; after a service crash a chunk may be copied
  twice, never skipped.
* **Few round trips.** One ``jobs()`` call per agent per poll round tells which processes still run; only
  jobs that ended cost a call of their own.
* **Node loss.** A node whose agent does not answer (Ray node dead or partitioned) keeps its jobs as
  running for ``lost_after_s``; after that their polls return
  :data:`~rlsched.runtime.executor.EXIT_NODE_LOST` and the service requeues or records them (exactly once).
  The processes of a job lost with its node are fenced by the log pump as soon as that node's agent answers
  (no poll notices the return of a node whose jobs are all settled). A gang is lost with the node of any
  rank: its ranks on nodes that answer are fenced at once, and :meth:`RayExecutor.lost_node` names a
  member's node for the service's record. A member's node that answers again within ``lost_after_s`` keeps
  its rank, which :meth:`RayExecutor.strays` never offers for fencing.
* **Fencing.** A node that answers again, or a new agent (after its node or the service restarted), has
  its live jobs listed by :meth:`RayExecutor.strays`; the service fences those it no longer runs there. A
  fence its agent does not answer is tried again by the log pump every :data:`REFENCE_S` until it does
  (strays are listed once per agent, so a fence lost to a timeout would leave the process running).
* **One service per cluster.** Creating the executor takes the cluster's lease
  (:mod:`~rlsched.runtime.fleet.lease`); the pump renews it and collects refused attempts as notices.
* **Launches of a replaced service are refused.** Creating the executor also takes an epoch above any the
  agents have seen and claims every agent that answers with it, before the service recovers a job; every
  launch carries it, and an agent refuses launches of an older epoch (see
  :mod:`~rlsched.runtime.fleet.agent`). A launch the previous service still had on its way when it was
  killed can then never start a job its successor has already requeued. Agents found later (a new node, a
  node that answers again) are claimed before their jobs are listed.
* **A job without a pid on a silent node waits too.** A job the store shows running without a pid (its launch
  was on its way when the previous service died) whose node does not answer at restart gets an *unconfirmed*
  handle (pid :data:`~rlsched.runtime.executor.UNKNOWN_PID`) from :meth:`_NodeJobs.find`, not None: requeueing
  it at once could run it twice if the launch did start there. Its polls wait like any job of a silent node
  and return :data:`~rlsched.runtime.executor.EXIT_NODE_LOST` after ``lost_after_s``; when the node answers
  first, its agent is claimed (so a launch still on its way is refused from then on) and asked for the job,
  and the service adopts the process it finds, or requeues the job if there is none.
* **A launch that is not answered is not a failed launch.** A busy agent (many launches at once on a loaded
  machine) may answer a launch after :attr:`RayExecutor.launch_wait_s`; it would still start the job. So a
  launch not answered in time returns an unconfirmed handle and its call stays on its way: the job waits,
  running without a pid, and :meth:`_NodeJobs.find` gives the process once the agent answers (or None with
  the refusal as its recorded exit, :data:`~rlsched.runtime.executor.EXIT_NOT_EXECUTABLE`, if the agent
  refused it). The agent is not asked for the job meanwhile: that question could overtake the launch in the
  agent's threads and be answered "no such job". Only if its node stops answering for ``lost_after_s`` is the
  job lost (its process fenced if the node comes back). A gang sends every rank's launch before it waits for
  any answer, and waits the same way: its handle stays unconfirmed until every rank has answered, and the ranks
  that started meanwhile run (their output is copied from the start once the gang begins). A rank refused, or
  not answered within ``lost_after_s``, fails the gang's launch: its started ranks are fenced, and a rank that
  starts later is fenced by the log pump as soon as its agent answers.
* **A gang adopted after a restart is checked rank by rank.** The service adopts a gang's leader with the
  job's devices (:meth:`_NodeJobs.adopt`, :meth:`_NodeJobs.find`), so the executor knows which nodes must hold
  its ranks. A rank found running there is a member (never a stray, though the store names only the leader's
  node). A rank that ended while no service ran counts as a member that ended (a failure stops the leader). A
  node that answers with neither never started its rank: the launch was on its way when the previous service
  died and this epoch refused it, or the rank vanished with its wrapper. The leader would then wait at the
  gang's rendezvous until the job's own timeout, holding every node's GPUs, so its poll fences the gang's
  running ranks and returns :data:`~rlsched.runtime.executor.EXIT_LOST` (the service requeues the job).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlsched.posix import atomic_write
from rlsched.runtime.executor import (
    EXIT_LOST,
    EXIT_NODE_LOST,
    EXIT_NOT_EXECUTABLE,
    UNKNOWN_PID,
    ExecutorError,
    Launched,
    open_private,
    private_dir,
)
from rlsched.runtime.fleet.agent import LOG_CHUNK, JobLaunch
from rlsched.runtime.fleet.directory import AgentRef, AgentUnavailable, AnswerPending, SentCall
from rlsched.runtime.fleet.lease import LEASE_TTL_S, ServiceLease

if TYPE_CHECKING:
    from rlsched.runtime.fleet.backend import RayBackend

LOG = logging.getLogger("rlsched.fleet")

#: Seconds a node may stay silent before its running jobs count as lost.
NODE_LOST_AFTER_S = 30.0
#: How often the pump copies logs (seconds); the lease is renewed every :data:`RENEW_S`.
PUMP_S = 0.5
RENEW_S = 3.0
#: A poll round reuses one ``jobs()`` answer per agent for this long.
SNAPSHOT_S = 0.2
#: What one round of ``jobs()`` calls found: node -> job id -> {(pid, start time)} alive there; a node is
#: present only if its agent answered.
Snapshot = dict[str, dict[str, set[tuple[int, int]]]]
#: Seconds gang members get between SIGTERM and SIGKILL once their leader ended.
GANG_GRACE_S = 10.0
#: Seconds between tries of a fence whose agent did not answer (each try may wait the call timeout).
REFENCE_S = 10.0
_OFFSETS = ".remote-log-offsets.json"


class RayExecutor:
    """Job processes on the agents of a :class:`~rlsched.runtime.fleet.backend.RayBackend` (module doc).

    Raises:
        BackendError: another service holds the cluster's lease.
    """

    #: a job may span nodes (admission lets a gang be as large as a pool, not a node)
    spans_nodes = True

    def __init__(self, backend: RayBackend, log_dir: str | os.PathLike[str], *,
                 lost_after_s: float = NODE_LOST_AFTER_S, lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.backend = backend
        self.directory = backend.directory
        self.log_dir = private_dir(log_dir)
        self.lost_after_s = float(os.environ.get("RLSCHED_NODE_LOST_AFTER_S", lost_after_s))
        state_dir = str(self.log_dir.resolve().parent)
        self.lease = ServiceLease(f"{socket.gethostname()}:{state_dir}",
                                  {"service": f"pid {os.getpid()} on {socket.gethostname()}", "state_dir": state_dir},
                                  lease_ttl_s)
        self.lease.acquire()
        self._lock = threading.RLock()
        #: this service's epoch: above every epoch an agent has seen (see the module doc)
        self.epoch = time.time_ns()
        self._claim(self.directory.agents() or self.directory.refresh())
        #: node -> monotonic time it was first found silent
        self._silent_since: dict[str, float] = {}
        #: agents (ray node, pid) whose jobs were offered to :meth:`strays`
        self._greeted: set[tuple[str, int]] = set()
        self._returned: set[str] = set()
        self._snapshot: tuple[float, Snapshot] = (0.0, {})
        #: "node/job id" -> (handle, line prefix) of every live process whose log is copied
        self._live: dict[str, tuple[Launched, bytes]] = {}
        #: "node/job id" -> a member's output after its last newline, not copied yet
        self._partial: dict[str, bytes] = {}
        #: job id -> its gang members (ranks 1..n-1) still running
        self._members: dict[str, list[Launched]] = {}
        #: members stopped after their leader ended -> when SIGKILL follows
        self._reaping: dict[tuple[str, str, int], float] = {}
        #: job id -> (the ended leader's exit code, when its still running members get SIGTERM)
        self._leader_rc: dict[str, tuple[int, float]] = {}
        #: job id -> the exit code of its first member that failed
        self._gang_failed: dict[str, int] = {}
        #: job id -> the nodes of a gang this service adopted after a restart (every one must hold a rank)
        self._gang_nodes: dict[str, list[str]] = {}
        #: job id -> why a gang adopted after a restart cannot complete (a rank that never started)
        self._incomplete: dict[str, str] = {}
        #: job id -> the node of a gang member that stayed silent for ``lost_after_s`` (the gang is lost with it)
        self._member_lost: dict[str, str] = {}
        #: job id -> that node, once the gang was settled as lost with it (:meth:`lost_node`)
        self._lost_nodes: dict[str, str] = {}
        #: how long a launch waits for its agent's answer before its job counts as unconfirmed (module doc)
        self.launch_wait_s = self.directory.call_timeout_s
        #: job id -> its launch, sent to an agent that has not answered it yet
        self._unanswered: dict[str, SentCall] = {}
        #: job id -> why an agent refused its launch when it finally answered
        self._refused: dict[str, str] = {}
        #: job id -> a gang launch some of whose ranks have not answered yet (its handle is unconfirmed)
        self._pending_gangs: dict[str, _GangLaunch] = {}
        #: (node, job id, launch) of gang ranks not answered in time, whose gang's launch failed: fenced if they start
        self._abandoned: list[tuple[str, str, SentCall]] = []
        #: (node, job id, pid) -> (when to try, why) of processes to fence whose agent has not answered yet
        self._unfenced: dict[tuple[str, str, int], tuple[float, str]] = {}
        self._offsets: dict[str, int] = self._load_offsets()
        self._offsets_dirty = False
        self._notices: list[dict[str, Any]] = []
        #: one copy of logs at a time (the pump's rounds and a finished job's last copy)
        self._copy_lock = threading.Lock()
        self._stop = threading.Event()
        self._pump = threading.Thread(target=self._run_pump, name="rlsched-log-pump", daemon=True)
        self._pump.start()

    def _claim(self, refs: list[AgentRef]) -> None:
        """Claim the agents ``refs`` with :attr:`epoch`, first raising it above any epoch one of them has seen
        (a clock behind a predecessor's must not make every launch refused). Silent agents are skipped."""
        refs = [r for r in refs if self.fences(r)]
        for _ in range(2):
            seen = [v for v in self.directory.fan_out(refs, "claim", self.epoch).values() if isinstance(v, int)]
            top = max(seen, default=0)
            if top <= self.epoch:
                return
            self.epoch = top + 1

    @staticmethod
    def fences(ref: AgentRef) -> bool:
        """Whether the agent knows epochs: a detached agent started by an older rlsched keeps running the
        old code until it restarts, and is sent launches without one (it fences nothing)."""
        return hasattr(ref.handle, "claim")

    def send_launch(self, ref: AgentRef, host: str, job_id: str, run: JobLaunch) -> SentCall:
        """Send the start of ``run`` on ``host`` to its agent with this service's epoch (the old call, without
        one, on an agent that does not fence)."""
        if self.fences(ref):
            return self.directory.send(ref, "start", host, job_id, run, self.epoch)
        return self.directory.send(ref, "launch", host, job_id, list(run.argv), list(run.devices), dict(run.env),
                                   run.cwd)

    def launched(self, node: str, job_id: str, sent: SentCall, wait_s: float) -> Launched:
        """The handle of a launch sent to ``node``'s agent, once it answered within ``wait_s`` (raises as
        :meth:`AgentDirectory.answer`)."""
        h, old = self.directory.answer(sent, wait_s)
        self.superseded(node, job_id, old)
        return self.track(h)

    def await_launch(self, node: str, job_id: str, sent: SentCall) -> Launched:
        """Keep waiting for a launch that was not answered within :attr:`launch_wait_s`; an unconfirmed handle
        (the job waits for the answer, or for its node to count as lost: module doc)."""
        with self._lock:
            self._unanswered[job_id] = sent
        LOG.info("launch of job %s on node %s: no answer within %g s; waiting for it", job_id, node,
                 self.launch_wait_s)
        return self.unconfirmed(node, job_id)

    def unconfirmed(self, node: str, job_id: str) -> Launched:
        """A handle of ``job_id`` on ``node`` whose process is not known yet (pid UNKNOWN_PID; module doc)."""
        return Launched(job_id, UNKNOWN_PID, 0, self.log_dir / f"{job_id}.log", Path(""), node)

    def take_refusal(self, job_id: str) -> str | None:
        """Why the agent refused ``job_id``'s launch when it answered late (once), else None."""
        with self._lock:
            return self._refused.pop(job_id, None)

    def unanswered_launch(self, node: str, job_id: str) -> Launched | None:
        """The state of a launch of ``job_id`` that was sent but not answered in time (module doc): its handle
        once the agent answered, an unconfirmed handle while it has not, None if the agent refused it (its
        reason in :meth:`_NodeJobs.recorded_exit`) or there is no such launch.

        Raises:
            AgentUnavailable: the agent died with the launch on its way (whether it started is then asked
                like for any job without a pid).
        """
        with self._lock:
            sent = self._unanswered.get(job_id)
            gang = self._pending_gangs.get(job_id)
        if gang is not None:
            return self._unanswered_gang(job_id, gang)
        if sent is None:
            return None
        try:
            h: Launched | None = self.launched(node, job_id, sent, 0.0)
        except AnswerPending:
            return self.unconfirmed(node, job_id)
        except AgentUnavailable:
            self.forget_launch(job_id)
            raise
        except Exception as exc:  # what a launch answered at once would have failed with: the job fails alike
            LOG.warning("launch of job %s on node %s failed when its agent answered: %s", job_id, node, exc)
            with self._lock:
                self._refused[job_id] = str(exc)
            h = None
        self.forget_launch(job_id)
        return h

    def _unanswered_gang(self, job_id: str, gang: _GangLaunch) -> Launched | None:
        """:meth:`unanswered_launch` of a gang: its leader's handle once every rank answered, an unconfirmed
        handle while one has not, None once a rank was refused or stayed unanswered for ``lost_after_s`` (the
        launch fails: its started ranks are fenced, a late one when it starts; the reason in
        :meth:`take_refusal`)."""
        failure = self._collect_gang(job_id, gang, 0.0)
        if failure is None and gang.sent and time.monotonic() - gang.since >= self.lost_after_s:
            failure = "; ".join(f"rank {r} on {gang.hosts[r]}: no answer to its launch within "
                                f"{self.lost_after_s:g} s" for r in gang.sent)
        if failure is None and gang.sent:
            return self.unconfirmed(gang.hosts[0], job_id)
        with self._lock:
            self._pending_gangs.pop(job_id, None)
        if failure is None:
            return self._begin_gang(job_id, gang)
        LOG.warning("gang %s: launch failed: %s", job_id, failure)
        self._drop_gang(job_id, gang)
        with self._lock:
            self._refused[job_id] = f"gang of {len(gang.hosts)} nodes: {failure}"
        return None

    def has_unanswered(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._unanswered or job_id in self._pending_gangs

    def forget_launch(self, job_id: str) -> None:
        """Stop waiting for a launch's answer (its node is lost: the job is settled; a process it started
        there is fenced as a stray if the node answers again; a waiting gang's ranks are fenced)."""
        with self._lock:
            self._unanswered.pop(job_id, None)
            gang = self._pending_gangs.pop(job_id, None)
        if gang is not None:
            self._drop_gang(job_id, gang)

    # ------------------------------------------------------------------ routing
    def on(self, node: str) -> _NodeJobs:
        """The executor of ``node``'s jobs."""
        return _NodeJobs(self, node)

    def agent(self, node: str) -> AgentRef:
        """The agent managing ``node`` (:meth:`AgentDirectory.require`)."""
        return self.directory.require(node)

    def track(self, h: Launched, prefix: bytes = b"") -> Launched:
        """Copy ``h``'s log from now on (each line after ``prefix``); the handle with the service's log path."""
        local = Launched(h.job_id, h.pid, h.start_time, self.log_dir / f"{h.job_id}.log", h.exit_file, h.node)
        with self._lock:
            key = f"{h.node}/{h.job_id}"
            if key not in self._live:
                self._live[key] = (local, prefix)
        return local

    def _untrack(self, h: Launched) -> None:
        with self._lock:
            self._live.pop(f"{h.node}/{h.job_id}", None)

    def start_gang(self, job_id: str, argv: list[str], by_node: dict[str, list[str]], env: dict[str, str],
                   cwd: str | None) -> Launched:
        """One process per node of a multi-node job; all started or none (module doc).

        Every rank's launch is sent before any answer is awaited, so a gang waits for its slowest agent once,
        not for each agent in turn. Ranks still unanswered after :attr:`launch_wait_s` make the handle
        unconfirmed (:meth:`unanswered_launch` settles the gang later); a refusal fails the launch at once.
        """
        hosts = list(by_node)
        common = {**env, "RLSCHED_GANG_SIZE": str(len(hosts)), "RLSCHED_GANG_HOSTS": ",".join(hosts),
                  "RLSCHED_GANG_LEADER": hosts[0]}
        gang = _GangLaunch(hosts, time.monotonic())
        try:
            for rank, host in enumerate(hosts):
                run = JobLaunch(tuple(argv), tuple(by_node[host]), {**common, "RLSCHED_GANG_RANK": str(rank)}, cwd)
                gang.sent[rank] = self.send_launch(self.agent(host), host, job_id, run)
        except Exception as exc:  # an agent that cannot be called: the ranks already sent may still start
            self._drop_gang(job_id, gang)
            raise ExecutorError(f"gang of {len(hosts)} nodes: rank {len(gang.sent)} on {hosts[len(gang.sent)]}: "
                                f"{exc}") from None
        failure = self._collect_gang(job_id, gang, self.launch_wait_s)
        if failure is not None:
            self._drop_gang(job_id, gang)
            raise ExecutorError(f"gang of {len(hosts)} nodes: {failure}")
        if gang.sent:
            with self._lock:
                self._pending_gangs[job_id] = gang
            LOG.info("gang %s: ranks %s not answered within %g s; waiting for them", job_id,
                     ", ".join(f"{r} on {hosts[r]}" for r in gang.sent), self.launch_wait_s)
            return self.unconfirmed(hosts[0], job_id)
        return self._begin_gang(job_id, gang)

    def _collect_gang(self, job_id: str, gang: _GangLaunch, wait_s: float) -> str | None:
        """Take the answers of ``gang``'s ranks that came within ``wait_s`` (one deadline for all); what
        failed its launch (a refusal, an agent that died with it), or None."""
        deadline = time.monotonic() + wait_s
        for rank, sent in list(gang.sent.items()):
            host = gang.hosts[rank]
            try:
                h, old = self.directory.answer(sent, max(0.0, deadline - time.monotonic()))
            except AnswerPending:
                continue
            except Exception as exc:
                return f"rank {rank} on {host}: {exc}"
            del gang.sent[rank]
            self.superseded(host, job_id, old)
            gang.started[rank] = h
        return None

    def _drop_gang(self, job_id: str, gang: _GangLaunch) -> None:
        """Give up ``gang``'s launch: its started ranks are fenced now, its unanswered ones when they start."""
        for h in gang.started.values():
            with contextlib.suppress(Exception):
                self.fence(h.node, job_id, h.pid)
        with self._lock:  # a rank may still start: fenced when its agent answers (_fence_unowned)
            self._abandoned.extend((gang.hosts[rank], job_id, sent) for rank, sent in gang.sent.items())
        gang.sent.clear()

    def _begin_gang(self, job_id: str, gang: _GangLaunch) -> Launched:
        """Every rank of ``gang`` started: its members are watched and every rank's output copied home."""
        ranks = [gang.started[r] for r in range(len(gang.hosts))]
        with self._lock:
            self._members[job_id] = ranks[1:]
        for rank, m in enumerate(ranks[1:], start=1):
            self.track(m, f"[rank {rank} {m.node}] ".encode())
        return self.track(ranks[0])

    def _members_of(self, h: Launched, snap: Snapshot, leader_running: bool) -> list[Launched]:
        """``h``'s gang members: those started by this process, or after a restart those found running (and,
        for a gang adopted with its devices, those its nodes hold once they answer: :meth:`_settle_ranks`)."""
        with self._lock:
            known = self._members.get(h.job_id)
            check = h.job_id in self._gang_nodes
        if known is None:
            known = self._found_members(h, snap, {h.node})
            with self._lock:
                self._members[h.job_id] = known
        if check:
            known = self._settle_ranks(h, snap, known, leader_running)
        return list(known)

    def _found_members(self, h: Launched, snap: Snapshot, skip: set[str]) -> list[Launched]:
        """The processes of ``h``'s job that ``snap`` shows on nodes other than ``skip``, their logs copied."""
        found = [Launched(h.job_id, pid, start, self.log_dir / f"{h.job_id}.log", Path(""), node)
                 for node, jobs in snap.items() if node not in skip
                 for pid, start in jobs.get(h.job_id, ())]
        for m in found:
            self.track(m, f"[{m.node}] ".encode())
        return found

    def _settle_ranks(self, leader: Launched, snap: Snapshot, members: list[Launched],
                      leader_running: bool) -> list[Launched]:
        """Check that every node of a gang adopted after a restart holds its rank; the members with any found
        on nodes that answered since. Nodes still silent are checked at a later poll.

        A node that answers and neither runs the job nor holds an exit record of it never started its rank:
        the launch was on its way when the previous service died, and this service's epoch refused it (or
        it was lost with its sender). The leader would wait at the gang's rendezvous until the job's own
        timeout, holding every node's GPUs, so the gang is marked incomplete (:meth:`poll` fences it and
        requeues the job). A rank that ended with a failure while no service ran fails the gang and stops
        its leader, as a member that fails under a running service does.
        """
        with self._lock:
            nodes = self._gang_nodes.get(leader.job_id, [])
        have = {leader.node, *(m.node for m in members)}
        pending = False
        for node in nodes:
            if node in have:
                continue
            if node not in snap:
                pending = True  # silent: whether its rank runs is not known yet
                self._member_silent(leader.job_id, node)
                continue
            late = self._found_members(leader, {node: snap[node]}, set())
            if late:
                members = members + late
                with self._lock:
                    self._members[leader.job_id] = members
                continue
            try:
                rc: int | None = self.directory.call(self.agent(node), "recorded_exit", node, leader.job_id)
            except (AgentUnavailable, ExecutorError):
                pending = True
                continue
            with self._lock:
                if rc is None:
                    self._incomplete.setdefault(leader.job_id, f"its rank on node {node} never started")
                elif rc != 0:
                    self._gang_failed.setdefault(leader.job_id, rc)
            if rc is not None and rc != 0 and leader_running:
                self._signal(leader, signal.SIGTERM)
        if not pending:
            with self._lock:
                self._gang_nodes.pop(leader.job_id, None)
        return members

    def _member_silent(self, job_id: str, node: str) -> None:
        """A poll found the node of a rank of ``job_id``'s gang silent: once it is lost, so is the gang."""
        if self._silent(node) is not None:
            with self._lock:
                self._member_lost.setdefault(job_id, node)

    def by_node(self, node: str, devices: Sequence[str]) -> dict[str, list[str]]:
        """``devices`` grouped by the node each is on, ``node`` (the leader's) first; a device the last inventory
        does not know counts as ``node``'s."""
        where = self.backend.device_nodes()
        groups: dict[str, list[str]] = {node: []}
        for dev in devices:
            groups.setdefault(where.get(dev, node), []).append(dev)
        return groups

    def expect_ranks(self, job_id: str, node: str, devices: Sequence[str]) -> None:
        """Note the nodes a job adopted after a restart holds GPUs on (``node`` its leader's): a gang's
        members are then checked against them (:meth:`_settle_ranks`) rather than taken as found."""
        if not set(devices) <= self.backend.device_nodes().keys():
            with contextlib.suppress(Exception):  # no inventory read yet (or a stale one): read it now
                self.backend.inventory()
        nodes = list(self.by_node(node, devices))
        if len(nodes) > 1:
            with self._lock:
                if job_id not in self._members:
                    self._gang_nodes[job_id] = nodes

    def _end_incomplete(self, leader: Launched, rc: int | None, still: list[Launched], why: str) -> int:
        """A gang that cannot complete (:meth:`_settle_ranks`): its running ranks are fenced and its poll is
        EXIT_LOST (the job is requeued: none of its attempts ran as a whole) - unless its leader ended
        successfully without the missing rank, whose exit then stands."""
        LOG.warning("gang %s adopted after a restart: %s; its running ranks are fenced and the job requeued",
                    leader.job_id, why)
        self._fence_ranks(([leader] if rc is None else []) + still, f"gang incomplete after a restart: {why}")
        self._forget_gang(leader.job_id)
        return 0 if rc == 0 else EXIT_LOST

    def _end_member_lost(self, leader: Launched, rc: int | None, still: list[Launched], node: str) -> int:
        """A gang member's node stayed silent for ``lost_after_s``: the gang cannot go on without that rank, so
        it is settled like a job whose own node is lost (EXIT_NODE_LOST; :meth:`lost_node` names the node),
        its ranks fenced (:meth:`_lost_with`). A leader that already ended successfully keeps its exit."""
        LOG.warning("gang %s: node %s of its rank stopped answering %g s ago; the gang is lost with it",
                    leader.job_id, node, self.lost_after_s)
        self._lost_with(leader.job_id, node, ([leader] if rc is None else []) + still)
        if rc != 0:
            with self._lock:
                self._lost_nodes[leader.job_id] = node
        return 0 if rc == 0 else EXIT_NODE_LOST

    def _lost_with(self, job_id: str, node: str, ranks: list[Launched]) -> None:
        """Fence the processes of a job settled as lost with ``node``: those on other nodes now (a gang's ranks
        that answer), those on ``node`` by the log pump as soon as its agent answers (:meth:`_fence_later`;
        no poll would notice that node's return once the job is settled). Each kill is noticed as ``fenced``."""
        why = f"job {job_id}, lost with node {node}"
        self._fence_ranks([h for h in ranks if h.node != node], why)
        for h in ranks:
            if h.node == node and not h.unconfirmed:
                self._fence_later(h.node, h.job_id, h.pid, why, after_s=0.0)
                self._untrack(h)
        self._forget_gang(job_id)

    def _fence_ranks(self, ranks: list[Launched], why: str) -> None:
        """Fence a settled gang's ranks (each kill noticed as ``fenced``; one whose agent does not answer is
        tried again by the pump, which notices it then) and stop copying their logs."""
        for h in ranks:
            try:
                self.fence(h.node, h.job_id, h.pid)
            except AgentUnavailable:
                pass
            else:
                with self._lock:
                    self._notices.append({"reason": "fenced", "job": h.job_id, "node": h.node, "pid": h.pid,
                                          "why": why})
            self._untrack(h)

    def _forget_gang(self, job_id: str) -> None:
        """Drop what this executor kept of a settled gang."""
        with self._lock:
            for table in (self._incomplete, self._member_lost, self._gang_nodes, self._members, self._leader_rc,
                          self._gang_failed):
                table.pop(job_id, None)

    def lost_node(self, job_id: str) -> str | None:
        """The node whose loss settled ``job_id`` when it is not its leader's (a gang member's), once."""
        with self._lock:
            return self._lost_nodes.pop(job_id, None)

    def _watch_members(self, leader: Launched, leader_running: bool,
                       snap: Snapshot) -> list[Launched]:
        """Settle the members that ended (their last output copied; a failure while the leader runs stops
        the leader: the collective cannot go on without it); the members still running."""
        members = self._members_of(leader, snap, leader_running)
        still: list[Launched] = []
        for m in members:
            if m.node not in snap:
                still.append(m)  # on a silent node: counted as running until the node is lost, which loses the gang
                self._member_silent(leader.job_id, m.node)
                continue
            self._answered(m.node)
            if (m.pid, m.start_time) in snap[m.node].get(m.job_id, ()):
                still.append(m)
                continue
            rc = self._exit_of(m)
            self._finish_log(m)
            if rc is not None and rc != 0:
                with self._lock:
                    self._gang_failed.setdefault(leader.job_id, rc)
                if leader_running:
                    self._signal(leader, signal.SIGTERM)
        with self._lock:
            self._members[leader.job_id] = still
        return still

    def _gang_end(self, leader: Launched, rc: int, still: list[Launched]) -> int | None:
        """The leader ended with ``rc``: the gang ends with its last member (None until then). Members get
        :data:`GANG_GRACE_S` to finish after a successful leader (none after a failed one), then SIGTERM,
        then SIGKILL after as long again; the gang's exit is the leader's, else the first failed member's."""
        now = time.monotonic()
        with self._lock:
            first = self._leader_rc.setdefault(leader.job_id, (rc, now + (GANG_GRACE_S if rc == 0 else 0.0)))
        if still:
            if now >= first[1] and not any((m.node, m.job_id, m.pid) in self._reaping for m in still):
                for m in still:
                    self._signal(m, signal.SIGTERM)
                    with self._lock:
                        self._reaping[(m.node, m.job_id, m.pid)] = now + GANG_GRACE_S
            return None
        with self._lock:
            self._leader_rc.pop(leader.job_id, None)
            self._members.pop(leader.job_id, None)
            self._gang_nodes.pop(leader.job_id, None)
            failed = self._gang_failed.pop(leader.job_id, None)
        return failed if rc == 0 and failed is not None else rc

    def _exit_of(self, m: Launched) -> int | None:
        """The exit code of an ended process, from its agent (None if the agent does not answer)."""
        with contextlib.suppress(AgentUnavailable):
            return self._agent_poll(m)
        return None

    def _agent_poll(self, h: Launched) -> int | None:
        """Ask ``h``'s agent for its exit code (raises AgentUnavailable)."""
        rc: int | None = self.directory.call(self.agent(h.node), "poll", h.node, h.job_id, h.pid, h.start_time)
        return rc

    # ------------------------------------------------------------------ watch
    def _alive_on(self) -> Snapshot:
        """What runs where (:data:`Snapshot`), one ``jobs()`` call per agent (reused for SNAPSHOT_S)."""
        now = time.monotonic()
        with self._lock:
            taken, cached = self._snapshot
            if now - taken < SNAPSHOT_S:
                return cached
        agents = self.directory.refresh()
        answers = self.directory.fan_out(agents, "jobs")
        snap: Snapshot = {}
        for ref in agents:
            got = answers.get(ref.ray_node)
            if not isinstance(got, list):
                continue
            for host in ref.hosts:
                snap.setdefault(host, {})
            for node, job_id, pid, start in got:
                snap.setdefault(node, {}).setdefault(job_id, set()).add((int(pid), int(start)))
        with self._lock:
            self._snapshot = (now, snap)
        return snap

    def _silent(self, node: str) -> int | None:
        """A poll of a job whose node did not answer: None while it may come back, then EXIT_NODE_LOST."""
        with self._lock:
            since = self._silent_since.setdefault(node, time.monotonic())
        return EXIT_NODE_LOST if time.monotonic() - since >= self.lost_after_s else None

    def is_silent(self, node: str) -> bool:
        """Whether the last poll of a job on ``node`` found its agent silent (and none has answered since)."""
        with self._lock:
            return node in self._silent_since

    def _answered(self, node: str) -> None:
        with self._lock:
            if self._silent_since.pop(node, None) is not None:
                self._returned.add(node)

    def poll(self, job: Launched) -> int | None:
        """The job's exit code, None while it runs (or while its silent node may still come back); a gang's
        once all its ranks ended (see :meth:`_gang_end`)."""
        snap = self._alive_on()
        with self._lock:
            ended = self._leader_rc.get(job.job_id)
        rc = ended[0] if ended is not None else self._poll_leader(job, snap)
        if rc == EXIT_NODE_LOST:  # the leader's node is lost: the job is settled, and its processes fenced
            with self._lock:
                members = list(self._members.get(job.job_id, ()))
            self._lost_with(job.job_id, job.node, [job, *members])
            return rc
        still = self._watch_members(job, rc is None, snap)
        with self._lock:
            missing = self._incomplete.get(job.job_id)
            lost = self._member_lost.get(job.job_id)
        if missing is not None:
            return self._end_incomplete(job, rc, still, missing)
        if lost is not None:
            return self._end_member_lost(job, rc, still, lost)
        if rc is None:
            return None
        if not still and ended is None and job.job_id not in self._gang_failed:
            with self._lock:
                self._members.pop(job.job_id, None)
            return rc  # a one-node job (or a gang whose members all ended first, none failing)
        return self._gang_end(job, rc, still)

    def _poll_leader(self, job: Launched, snap: Snapshot) -> int | None:
        if job.unconfirmed:
            return self._poll_unconfirmed(job, snap)
        if job.node not in snap:
            # its agent did not answer this round's jobs() (or there is none): no call per job, which
            # would wait the call timeout once for every job of a partitioned node
            return self._silent(job.node)
        self._answered(job.node)
        if any(pid == job.pid for pid, _ in snap[job.node].get(job.job_id, ())):
            self.track(job)
            return None
        try:
            rc = self._agent_poll(job)
        except AgentUnavailable:
            return self._silent(job.node)
        self._answered(job.node)
        if rc is None:
            self.track(job)
            return None
        self._finish_log(job)  # the last output before the exit is reported
        return rc

    def _poll_unconfirmed(self, job: Launched, snap: Snapshot) -> int | None:
        """A poll of a pid-less job's handle (see the module doc): None while its node is silent (until it
        is lost) or while a process of the job runs there; EXIT_LOST once the node answers without one."""
        if job.node not in snap:
            rc = self._silent(job.node)
            if rc is not None:
                self.forget_launch(job.job_id)
            return rc
        self._answered(job.node)
        if self.has_unanswered(job.job_id):
            return None  # its agent answers, and will start it or refuse it: asking for it now could race the start
        try:
            ref = self.agent(job.node)
            self._claim([ref])  # from now on a launch of the dead service is refused: the answer below holds
            found: Launched | None = self.directory.call(ref, "find", job.node, job.job_id)
        except (AgentUnavailable, ExecutorError):
            return self._silent(job.node)
        return None if found is not None else EXIT_LOST  # found: the service's next pass adopts it

    def _finish_log(self, h: Launched) -> None:
        with contextlib.suppress(Exception):
            self._copy_log(h, final=True)
        self._untrack(h)

    def send_signal(self, job: Launched, sig: signal.Signals) -> None:
        """Signal the job's process group on its node, and its gang members on theirs."""
        self._signal(job, sig)
        with self._lock:
            members = list(self._members.get(job.job_id, ()))
        for m in members:
            self._signal(m, sig)

    def _signal(self, h: Launched, sig: signal.Signals) -> None:
        """Signal one process (lost silently if its node does not answer)."""
        with contextlib.suppress(AgentUnavailable):
            self.directory.call(self.agent(h.node), "signal", h.node, h.job_id, h.pid, h.start_time, int(sig))

    def strays(self) -> list[tuple[str, str, int]]:
        """Live jobs of agents not seen before and of nodes that answer again (see the module doc), less the
        ranks of gangs this service watches (:meth:`_is_rank`): those run for it, on nodes other than the
        one the store names for their job."""
        agents = self.directory.agents()
        out: list[tuple[str, str, int]] = []
        with self._lock:
            fresh = [r for r in agents if (r.ray_node, r.pid) not in self._greeted]
            returned, self._returned = self._returned, set()
        check = fresh + [r for r in agents if r not in fresh and set(r.hosts) & returned]
        if not check:
            return out
        self._claim(check)
        answers = self.directory.fan_out(check, "jobs")
        for ref in check:
            got = answers.get(ref.ray_node)
            if isinstance(got, list):
                with self._lock:
                    self._greeted.add((ref.ray_node, ref.pid))
                out.extend((str(n), str(j), int(p)) for n, j, p, _ in got if not self._is_rank(str(n), str(j), int(p)))
        return out

    def _is_rank(self, node: str, job_id: str, pid: int) -> bool:
        """Whether that process is a member of a gang this service watches: one it started or found, or any on
        a node of a gang adopted after a restart whose ranks are not all checked yet (:meth:`_settle_ranks`)."""
        with self._lock:
            if node in self._gang_nodes.get(job_id, [])[1:]:
                return True
            return any(m.node == node and m.pid == pid for m in self._members.get(job_id, ()))

    def fence(self, node: str, job_id: str, pid: int) -> None:
        """SIGKILL a stray job process on ``node``.

        Raises:
            AgentUnavailable: its agent did not answer; the log pump tries again every :data:`REFENCE_S`
                until the agent answers (:meth:`_fence_later`), and notices the kill then.
        """
        try:
            self.directory.call(self.agent(node), "fence", node, job_id, pid)
        except AgentUnavailable:
            self._fence_later(node, job_id, pid, "a stray whose first fence its agent did not answer")
            raise

    def _fence_later(self, node: str, job_id: str, pid: int, why: str, after_s: float | None = None) -> None:
        """Have the log pump fence that process in ``after_s`` (default :data:`REFENCE_S`), and again every
        :data:`REFENCE_S` until its agent answers."""
        wait = REFENCE_S if after_s is None else after_s
        with self._lock:
            self._unfenced[(node, job_id, pid)] = (time.monotonic() + wait, why)

    def superseded(self, node: str, job_id: str, pid: int | None) -> None:
        """Note a stray the agent killed before starting a new attempt of its job (audited as fenced)."""
        if pid is not None:
            with self._lock:
                self._notices.append({"reason": "fenced", "job": job_id, "node": node, "pid": pid,
                                      "why": "superseded by a new attempt"})

    def fencing_nodes(self) -> set[str]:
        """The nodes where a process still waits for its fence (:meth:`_fence_later`)."""
        with self._lock:
            return {node for node, _, _ in self._unfenced}

    def notices(self) -> list[dict[str, Any]]:
        """What the service should audit since the last call: each a dict with ``reason`` (``fenced``,
        ``second-service-refused``, ``lease-error``), maybe ``job``, and details."""
        with self._lock:
            out, self._notices = self._notices, []
        return out

    # ------------------------------------------------------------------ logs and the lease
    def _run_pump(self) -> None:
        next_renew = time.monotonic() + RENEW_S
        while not self._stop.wait(PUMP_S):
            with self._lock:
                live = [h for h, _ in self._live.values()]
                due = [k for k, t in self._reaping.items() if time.monotonic() >= t]
                for k in due:
                    del self._reaping[k]
            with contextlib.suppress(Exception):
                self._copy_logs(live)
            for node, job_id, pid in due:  # gang members that ignored their SIGTERM
                with contextlib.suppress(Exception):
                    self.fence(node, job_id, pid)
            self._fence_unowned()
            self._save_offsets()
            if time.monotonic() >= next_renew:
                next_renew = time.monotonic() + RENEW_S
                try:
                    notes = [{"reason": "second-service-refused", **r} for r in self.lease.renew()]
                except Exception as exc:  # a renewal that fails is retried; the service keeps running
                    notes = [{"reason": "lease-error", "error": str(exc)}]
                with self._lock:
                    self._notices.extend(notes)

    def _fence_unowned(self) -> None:
        """Kill what nobody runs any more, once its agent answers (each kill noticed as ``fenced``): the
        process of an abandoned gang rank whose launch was answered at last (its gang's launch failed
        without it), and strays whose fence was not answered (retried every :data:`REFENCE_S`)."""
        with self._lock:
            abandoned, self._abandoned = self._abandoned, []
        keep = []
        for node, job_id, sent in abandoned:
            try:
                h, old = self.directory.answer(sent, 0.0)
            except AnswerPending:
                keep.append((node, job_id, sent))
                continue
            except Exception:  # refused, or its agent died with it: nothing started
                continue
            self.superseded(node, job_id, old)
            self._fence_later(node, job_id, h.pid, "a gang rank that started after its gang's launch had failed",
                              after_s=0.0)
        now = time.monotonic()
        with self._lock:
            self._abandoned.extend(keep)
            waiting = list(self._unfenced.items())
        # due: its retry time came, or its node answered the last inventory (which reports the node unknown
        # until this fence is done: fenced now, not REFENCE_S later); asked outside this executor's lock
        due = [(k, why) for k, (t, why) in waiting if t <= now or self.backend.answered(k[0])]
        for (node, job_id, pid), why in due:
            try:
                self.directory.call(self.agent(node), "fence", node, job_id, pid)
            except AgentUnavailable:
                self._fence_later(node, job_id, pid, why)  # still silent: again later
                continue
            except Exception as exc:  # the agent failed the kill itself: say so, do not loop on it
                LOG.warning("fence of job %s (pid %d) on node %s failed: %s", job_id, pid, node, exc)
            with self._lock:
                self._unfenced.pop((node, job_id, pid), None)
                self._notices.append({"reason": "fenced", "job": job_id, "node": node, "pid": pid, "why": why})

    def _copy_logs(self, handles: list[Launched]) -> None:
        """One copy round: a single ``read_logs`` call per agent for all its live jobs; a job with more
        output than one chunk is then drained on its own."""
        by_agent: dict[str, tuple[AgentRef, list[Launched]]] = {}
        for h in handles:
            ref = self.directory.agent_for(h.node)
            if ref is not None:
                by_agent.setdefault(ref.ray_node, (ref, []))[1].append(h)
        with self._copy_lock:
            refs = [ref for ref, _ in by_agent.values()]
            with self._lock:
                wanted = {r.ray_node: [(h.node, h.job_id, self._offsets.get(f"{h.node}/{h.job_id}", 0))
                                       for h in by_agent[r.ray_node][1]] for r in refs}
            answers = self.directory.fan_out_each(refs, "read_logs", {r.ray_node: (wanted[r.ray_node],) for r in refs})
            more = []
            for nid, (_, hs) in by_agent.items():
                chunks = answers.get(nid)
                if not isinstance(chunks, list):
                    continue
                for h, (_, _, offset), chunk in zip(hs, wanted[nid], chunks, strict=True):
                    if chunk:
                        self._take(h, offset, chunk)
                    if len(chunk) >= LOG_CHUNK:
                        more.append(h)
        for h in more:
            self._copy_log(h)

    def _copy_log(self, h: Launched, final: bool = False) -> None:
        """Append ``h``'s new output on its node to the service's log of the job (``final``: its last)."""
        key = f"{h.node}/{h.job_id}"
        ref = self.directory.agent_for(h.node)
        with self._copy_lock:
            while ref is not None:
                with self._lock:
                    offset = self._offsets.get(key, 0)
                try:
                    chunk: bytes = self.directory.call(ref, "read_log", h.node, h.job_id, offset)
                except AgentUnavailable:
                    break
                if not chunk:
                    break
                self._take(h, offset, chunk)
            if final:
                with self._lock:
                    prefix = self._live.get(key, (h, b""))[1]
                    tail = self._partial.pop(key, b"")
                if tail:
                    self._write(h.job_id, prefix + tail + b"\n")

    def _take(self, h: Launched, offset: int, chunk: bytes) -> None:
        """Write a chunk read at ``offset`` and move the job's offset past it (under the copy lock)."""
        key = f"{h.node}/{h.job_id}"
        with self._lock:
            prefix = self._live.get(key, (h, b""))[1]
        self._append(h.job_id, key, prefix, chunk)
        with self._lock:
            self._offsets[key] = offset + len(chunk)
            self._offsets_dirty = True

    def _append(self, job_id: str, key: str, prefix: bytes, chunk: bytes) -> None:
        """Write a chunk to the job's log; a member's chunk line by line behind its prefix."""
        if prefix:
            with self._lock:
                lines = (self._partial.pop(key, b"") + chunk).split(b"\n")
                if lines[-1]:
                    self._partial[key] = lines[-1]
            chunk = b"".join(prefix + ln + b"\n" for ln in lines[:-1])
        if chunk:
            self._write(job_id, chunk)

    def _write(self, job_id: str, data: bytes) -> None:
        fd = open_private(self.log_dir / f"{job_id}.log", os.O_WRONLY | os.O_APPEND)
        with os.fdopen(fd, "ab") as f:
            f.write(data)

    def _load_offsets(self) -> dict[str, int]:
        try:
            return {str(k): int(v) for k, v in json.loads((self.log_dir / _OFFSETS).read_text()).items()}
        except (FileNotFoundError, ValueError, AttributeError):
            return {}

    def _save_offsets(self) -> None:
        with self._lock:
            if not self._offsets_dirty:
                return
            # keep the offsets of finished jobs too (a requeue may return to the node), up to a bound
            data = dict(self._offsets) if len(self._offsets) < 10_000 else \
                {k: v for k, v in self._offsets.items() if k in self._live}
            self._offsets_dirty = False
        atomic_write(self.log_dir / _OFFSETS, json.dumps(data), mode=0o600)

    def close(self) -> None:
        """Stop the pump (after a last copy) and give the lease back."""
        self._stop.set()
        self._pump.join(5)
        with self._lock:
            live = [h for h, _ in self._live.values()]
        for h in live:
            with contextlib.suppress(Exception):
                self._copy_log(h)
        self._save_offsets()
        self.lease.release()


@dataclass
class _GangLaunch:
    """A gang's launch in flight: each rank's call until it is answered, then its process."""

    hosts: list[str]
    #: when its launches were sent (monotonic)
    since: float
    sent: dict[int, SentCall] = field(default_factory=dict)
    started: dict[int, Launched] = field(default_factory=dict)


class _NodeJobs:
    """One node's side of a :class:`RayExecutor`: launches and exit records go to that node's agent."""

    def __init__(self, parent: RayExecutor, node: str) -> None:
        self.parent = parent
        self.node = node
        self.log_dir = parent.log_dir

    def _call(self, method: str, *args: Any) -> Any:
        p = self.parent
        return p.directory.call(p.agent(self.node), method, *args)

    def on(self, node: str) -> _NodeJobs:
        return self.parent.on(node)

    def launch(self, job_id: str, argv: Sequence[str], visible_devices: Sequence[str],
               env_extra: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> Launched:
        """Start the job on this node, or on each node its devices are on (raises ExecutorError, also when a
        node does not answer)."""
        by_node = self.parent.by_node(self.node, visible_devices)
        env, wd = dict(env_extra or {}), None if cwd is None else str(cwd)
        if len(by_node) > 1:
            return self.parent.start_gang(job_id, list(argv), by_node, env, wd)
        p = self.parent
        try:
            sent = p.send_launch(p.agent(self.node), self.node, job_id,
                                 JobLaunch(tuple(argv), tuple(visible_devices), env, wd))
            return p.launched(self.node, job_id, sent, p.launch_wait_s)
        except AnswerPending:
            # sent, not answered: the agent may still start it, so the job is neither failed nor free to run
            # again; it waits, unconfirmed, for the answer (or for its node to count as lost)
            return p.await_launch(self.node, job_id, sent)
        except AgentUnavailable as exc:
            raise ExecutorError(f"node {self.node}: {exc}") from None

    def adopt(self, pid: int, start_time: int, exit_file: str | os.PathLike[str] | None = None,
              job_id: str = "", log_path: str | os.PathLike[str] | None = None,
              devices: Sequence[str] = ()) -> Launched | None:
        """Re-attach after a service restart; a job on a silent node keeps an unconfirmed handle (its poll
        decides: the node answers again, or it is lost after ``lost_after_s``). A gang's ``devices`` say which
        nodes must hold its ranks (:meth:`RayExecutor.expect_ranks`)."""
        try:
            h: Launched | None = self._call("adopt", self.node, job_id, pid, start_time)
        except AgentUnavailable:
            h = Launched(job_id, pid, start_time, self.log_dir / f"{job_id}.log", Path(""), self.node)
            self.parent.expect_ranks(job_id, self.node, devices)
            return h
        if h is None:
            return None
        self.parent.expect_ranks(job_id, self.node, devices)
        return self.parent.track(h)

    def find(self, job_id: str, devices: Sequence[str] = ()) -> Launched | None:
        """The job's live process on this node; on a silent node an unconfirmed handle (pid
        :data:`~rlsched.runtime.executor.UNKNOWN_PID`: whether it runs there is not known yet, see the module
        doc). A node already known to be silent is not called again: each call would wait out the call timeout.
        ``devices`` as for :meth:`adopt` (a launch of this service's own in flight is settled without them)."""
        if self.parent.has_unanswered(job_id):
            with contextlib.suppress(AgentUnavailable):
                return self.parent.unanswered_launch(self.node, job_id)
        unconfirmed = self.parent.unconfirmed(self.node, job_id)
        if self.parent.is_silent(self.node):
            return unconfirmed
        try:
            h: Launched | None = self._call("find", self.node, job_id)
        except AgentUnavailable:
            return unconfirmed
        if h is None:
            return None
        self.parent.expect_ranks(job_id, self.node, devices)
        return self.parent.track(h)

    def poll(self, job: Launched) -> int | None:
        return self.parent.poll(job)

    def send_signal(self, job: Launched, sig: signal.Signals) -> None:
        self.parent.send_signal(job, sig)

    def recorded_exit(self, job_id: str) -> int | None:
        """The exit its wrapper recorded on this node (raises AgentUnavailable if the agent does not answer:
        a silence is not "no record", see :meth:`JobExecutor.recorded_exit`)."""
        if self.parent.take_refusal(job_id) is not None:
            return EXIT_NOT_EXECUTABLE  # its launch was refused when the agent finally answered
        rc: int | None = self._call("recorded_exit", self.node, job_id)
        if rc is not None:
            # it ended with no handle here (it finished while no service ran): its output comes home now,
            # from where the last copy stopped, as a live job's last bytes do before its exit is reported
            self.parent._finish_log(self.parent.unconfirmed(self.node, job_id))
        return rc

    def consume_exits(self, job_id: str, known: Path | None = None) -> None:
        self._call("consume_exits", self.node, job_id, None if known is None else str(known))

    def lost_node(self, job_id: str) -> str | None:
        return self.parent.lost_node(job_id)

    def strays(self) -> list[tuple[str, str, int]]:
        return self.parent.strays()

    def fence(self, node: str, job_id: str, pid: int) -> None:
        self.parent.fence(node, job_id, pid)
