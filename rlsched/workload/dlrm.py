"""Reader of Alibaba's GPU-disaggregated DLRM inference trace (cluster-trace-gpu-v2025).

``disaggregated_DLRM_trace.csv`` lists ~24k long-running inference instances over
a ~31-day observation window: ``instance_sn, role, app_name, cpu_request,
cpu_limit, gpu_request, gpu_limit, rdma_*, memory_request, memory_limit, disk_*,
max_instance_per_node, creation_time, scheduled_time, deletion_time`` (times in
seconds from the window start; empty/NaN = outside the window).

They are background inference load, so they become ``JobKind.SERVICE`` jobs that
hold their GPU share for their whole lifetime. Mapping, and why:

* Only GPU instances (``gpu_request > 0``; in the published file the ``HN`` role)
  are kept; CPU-only instances (``CN``) are counted under ``"cpu-only"``.
* ``gpu_request == 1`` is *one inference container per 1/7 GPU* in the paper's
  deployment, i.e. the MIG ``1g`` case: ``num_gpus=1, gpu_milli=143``
  (round(1000/7)). A fractional request < 1 keeps its share
  (``round(request*1000)``); a request > 1 is that many whole GPUs.
* Missing times mean "outside the window", never "unknown": a missing
  ``creation_time`` means the instance already ran when observation began, so it
  is submitted at the window start (0); a missing ``deletion_time`` means it still
  ran at the window end, so it runs until then. The window end is the latest time
  that appears anywhere in the file (or ``window_end`` if given). Both cases give
  only a lower bound of the true lifetime and are marked ``duration_censored``.
* ``duration = deletion - scheduled_time`` (``creation_time`` if never scheduled,
  0 if neither is known), like the openb reader. Rows whose deletion is not after
  their start (a few in the published file) are counted under
  ``"non-positive duration"``.
* ``cpus = cpu_request``; ``mem_mib = memory_request x 1024`` (the request is in
  GiB: values 16..1000 per container); ``user = app_name``, so per-application
  quotas apply; ``priority`` stays 0, as the trace carries none.
* ``max_instance_per_node`` (an anti-affinity limit) has no field in ``Job`` and
  is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlsched.cluster.job import Job, JobKind
from rlsched.workload._csvio import (
    MISSING,
    RowError,
    Tally,
    optional_float,
    parse_float,
    shown,
)
from rlsched.workload.table_reader import read_table
from rlsched.workload.trace import Trace

REQUIRED = ("instance_sn", "gpu_request", "creation_time", "scheduled_time", "deletion_time")
#: The share of one GPU a ``gpu_request == 1`` container gets: a 1g MIG slice of 7.
MIG_1G_MILLI = 143

CPU_ONLY = "cpu-only"
NON_POSITIVE = "non-positive duration"


def read_dlrm_services(path: str | Path, *, skip_bad_rows: bool = False, window_end: float | None = None) -> Trace:
    """Read the DLRM inference instances as long-running services.

    Args:
        path: ``disaggregated_DLRM_trace.csv`` or a file with the same columns.
        skip_bad_rows: count malformed rows instead of raising.
        window_end: end of the observation window; default = latest time in the file.

    Raises:
        TraceError: missing file or column, or a bad row unless ``skip_bad_rows``.
    """
    return read_table(path, _InstanceTable(window_end), skip_bad_rows=skip_bad_rows)


@dataclass(frozen=True)
class _Instance:
    """One GPU instance row; times are None where the row leaves them outside the window."""

    sn: str
    created: float | None
    scheduled: float | None
    deleted: float | None
    ngpu: int
    milli: int
    cpus: float
    mem: int
    app: str


class _InstanceTable:
    """The DLRM parts of :func:`~rlsched.workload.table_reader.read_table`.

    Durations wait for the whole file: a still-running instance runs until the window end,
    the latest time anywhere in the file unless given.
    """

    what = "DLRM trace"
    required = REQUIRED
    empty_message = "empty file: expected a DLRM trace header"
    no_rows_message = "no instance rows: the file has only a header"

    def __init__(self, window_end: float | None) -> None:
        self.window_end = window_end
        self.latest = 0.0
        self.seen: set[str] = set()
        self.cols: tuple[int, ...] = ()
        self.optional: tuple[int | None, int | None, int | None] = (None, None, None)

    def columns(self, src: str, header: list[str], index: dict[str, int]) -> int:
        """Positions of the used columns; a row needs as many fields as the header's last named column."""
        self.cols = tuple(index[c] for c in REQUIRED)
        self.optional = (index.get("cpu_request"), index.get("memory_request"), index.get("app_name"))
        return max(index.values()) + 1

    def parse_row(self, line: int, fields: list[str], tally: Tally) -> _Instance | None:
        """A GPU instance; None for a CPU-only one (counted); RowError for a bad field or instance_sn."""
        i_sn, i_gpu, i_c, i_s, i_d = self.cols
        i_cpu, i_mem, i_app = self.optional
        created = optional_float(fields[i_c], "creation_time")
        scheduled = optional_float(fields[i_s], "scheduled_time")
        deleted = optional_float(fields[i_d], "deletion_time")
        for t in (created, scheduled, deleted):
            if t is not None and t > self.latest:
                self.latest = t
        share = _gpu_share(fields[i_gpu])
        if share is None:
            tally.skip(CPU_ONLY)
            return None
        ngpu, milli = share
        cpus = 0.0
        if i_cpu is not None and fields[i_cpu].strip() not in MISSING:
            cpus = parse_float(fields[i_cpu], "cpu_request")
        mem = 0
        if i_mem is not None and fields[i_mem].strip() not in MISSING:
            mem = round(parse_float(fields[i_mem], "memory_request") * 1024)
        sn = fields[i_sn].strip()
        if not sn or sn in self.seen:
            raise RowError("instance_sn", "empty instance_sn" if not sn else f"duplicate instance_sn {shown(sn)}")
        self.seen.add(sn)
        app = fields[i_app].strip() if i_app is not None else ""
        return _Instance(sn, created, scheduled, deleted, ngpu, milli, cpus, mem, app)

    def jobs(self, src: str, parsed: list[_Instance], tally: Tally) -> list[Job]:
        """Service jobs lasting until deletion or the window end; non-positive ones are counted and dropped."""
        end = self.latest if self.window_end is None else self.window_end
        jobs: list[Job] = []
        for inst in parsed:
            submit = 0.0 if inst.created is None else inst.created
            began = inst.scheduled if inst.scheduled is not None else submit
            stop = end if inst.deleted is None else inst.deleted
            duration = stop - began
            if duration <= 0:
                tally.skip(NON_POSITIVE)
                continue
            # Left-censored (created before the window) or right-censored (alive at its end).
            censored = inst.deleted is None or inst.created is None
            jobs.append(
                Job(
                    inst.sn,
                    submit,
                    duration,
                    inst.ngpu,
                    inst.milli,
                    user=inst.app,
                    cpus=inst.cpus,
                    mem_mib=inst.mem,
                    kind=JobKind.SERVICE,
                    duration_censored=censored,
                )
            )
        return jobs


def _gpu_share(text: str) -> tuple[int, int] | None:
    """``(num_gpus, gpu_milli)`` of a ``gpu_request`` cell, or None for a CPU-only instance."""
    req_text = text.strip()
    request = 0.0 if req_text in MISSING else parse_float(req_text, "gpu_request")
    if request < 0:
        raise RowError("gpu_request", f"gpu_request must be >= 0, got {shown(req_text)}")
    if request == 0:
        return None
    if request < 1:
        return 1, max(1, round(request * 1000))
    if request == 1:
        return 1, MIG_1G_MILLI
    if request.is_integer():
        return int(request), 1000
    raise RowError("gpu_request", f"gpu_request above 1 must be whole GPUs, got {shown(req_text)}")
