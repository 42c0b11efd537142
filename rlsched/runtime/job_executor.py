"""What the scheduler service needs from whatever runs its jobs' processes.

Two implementations: :class:`~rlsched.runtime.executor.LocalExecutor` (this machine: fork/exec under an
exit-recording wrapper) and :class:`~rlsched.runtime.fleet.executor.RayExecutor` (the node agents of a Ray
cluster, each running the same wrapper on its node). The service's supervision is written once against
this protocol: it routes a job to its node with :meth:`JobExecutor.on` and keeps handles
(:class:`~rlsched.runtime.executor.Launched`, which name their node) for polls and signals.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from rlsched.runtime.executor import Launched


class JobExecutor(Protocol):
    """Launch, watch, signal and re-adopt job processes (see the module doc).

    Attributes:
        log_dir: where the service keeps every job's log (``rlsched logs`` reads it), on its own machine.
    """

    log_dir: Path

    def on(self, node: str) -> JobExecutor:
        """The executor of ``node``'s jobs (launch, adopt, find and exit records go there)."""
        ...

    def launch(self, job_id: str, argv: Sequence[str], visible_devices: Sequence[str],
               env_extra: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> Launched:
        """Start a job with exactly ``visible_devices`` visible; its handle. An executor whose launches go to
        another machine may return an *unconfirmed* handle (``Launched.unconfirmed``) when the launch was sent
        but not answered yet: the job is then neither failed nor free to start again, and :meth:`find` says
        what became of it."""
        ...

    def adopt(self, pid: int, start_time: int, exit_file: str | os.PathLike[str] | None = None,
              job_id: str = "", log_path: str | os.PathLike[str] | None = None,
              devices: Sequence[str] = ()) -> Launched | None:
        """Re-attach to a job's process after a restart (pid AND start time must match); None if gone.

        ``devices`` are those the job holds, on every node: an executor whose jobs span nodes checks from
        them that each node's rank of a gang is there (one that never started makes the gang's poll
        ``EXIT_LOST``: its leader would wait at its rendezvous for good)."""
        ...

    def find(self, job_id: str, devices: Sequence[str] = ()) -> Launched | None:
        """A live process of ``job_id`` whose pid the service never recorded; None if there is none
        (``devices`` as for :meth:`adopt`)."""
        ...

    def poll(self, job: Launched) -> int | None:
        """The exit code, or None while it runs (``EXIT_LOST``, ``EXIT_NODE_LOST`` as documented there)."""
        ...

    def send_signal(self, job: Launched, sig: signal.Signals) -> None:
        """Signal the job's process group without waiting."""
        ...

    def recorded_exit(self, job_id: str) -> int | None:
        """The exit status the wrapper recorded for the latest attempt not consumed yet (None: none).

        Raises:
            BackendError: the machine holding the record did not answer; whether there is one is not known
                (the caller asks again later, and must not take the silence for "none").
        """
        ...

    def consume_exits(self, job_id: str, known: Path | None = None) -> None:
        """Mark a settled job's exit records seen."""
        ...

    def lost_node(self, job_id: str) -> str | None:
        """After a poll of ``job_id`` returned ``EXIT_NODE_LOST``: the node whose loss it was when that is not
        the node the job's allocation names (a multi-node job's other rank), once; else None."""
        ...

    def strays(self) -> list[tuple[str, str, int]]:
        """``(node, job id, pid)`` of job processes on nodes that (re)appeared since the last call: the service
        keeps those it still holds there and fences the rest (:meth:`fence`)."""
        ...

    def fence(self, node: str, job_id: str, pid: int) -> None:
        """Kill a job process the service no longer runs there (it was requeued or lost meanwhile)."""
        ...
