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

from pathlib import Path

from rlsched.cluster.job import Job, JobKind
from rlsched.errors import TraceError
from rlsched.workload._csvio import (
    MISSING,
    RowError,
    Tally,
    header_index,
    no_gc,
    open_text,
    optional_float,
    parse_float,
    rows,
    shown,
)
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
    src = str(path)
    tally = Tally(src, skip_bad_rows)
    parsed: list[tuple[str, float | None, float | None, float | None, int, int, float, int, str]] = []
    latest = 0.0
    data_rows = 0
    with no_gc(), open_text(path) as fh:
        it = rows(fh, src)
        first = next(it, None)
        if first is None:
            raise TraceError(src, None, None, "empty file: expected a DLRM trace header")
        header = first[1]
        idx = header_index(header, src, REQUIRED, "DLRM trace")
        i_sn, i_gpu = idx["instance_sn"], idx["gpu_request"]
        i_c, i_s, i_d = idx["creation_time"], idx["scheduled_time"], idx["deletion_time"]
        i_cpu, i_mem, i_app = idx.get("cpu_request"), idx.get("memory_request"), idx.get("app_name")
        need = max(idx.values()) + 1
        seen: set[str] = set()
        for line, f in it:
            data_rows += 1
            if len(f) < need:
                tally.bad(line, None, f"row has {len(f)} fields, the header has {len(header)}")
                continue
            try:
                created = optional_float(f[i_c], "creation_time")
                scheduled = optional_float(f[i_s], "scheduled_time")
                deleted = optional_float(f[i_d], "deletion_time")
                for t in (created, scheduled, deleted):
                    if t is not None and t > latest:
                        latest = t
                req_text = f[i_gpu].strip()
                request = 0.0 if req_text in MISSING else parse_float(req_text, "gpu_request")
                if request < 0:
                    raise RowError("gpu_request", f"gpu_request must be >= 0, got {shown(req_text)}")
                if request == 0:
                    tally.skip(CPU_ONLY)
                    continue
                if request < 1:
                    ngpu, milli = 1, max(1, round(request * 1000))
                elif request == 1:
                    ngpu, milli = 1, MIG_1G_MILLI
                elif request.is_integer():
                    ngpu, milli = int(request), 1000
                else:
                    raise RowError("gpu_request", f"gpu_request above 1 must be whole GPUs, got {shown(req_text)}")
                cpus = 0.0
                if i_cpu is not None and f[i_cpu].strip() not in MISSING:
                    cpus = parse_float(f[i_cpu], "cpu_request")
                mem = 0
                if i_mem is not None and f[i_mem].strip() not in MISSING:
                    mem = round(parse_float(f[i_mem], "memory_request") * 1024)
            except RowError as exc:
                tally.bad(line, exc.column, exc.message)
                continue
            sn = f[i_sn].strip()
            if not sn or sn in seen:
                tally.bad(line, "instance_sn", "empty instance_sn" if not sn else f"duplicate instance_sn {shown(sn)}")
                continue
            seen.add(sn)
            app = f[i_app].strip() if i_app is not None else ""
            parsed.append((sn, created, scheduled, deleted, ngpu, milli, cpus, mem, app))
    if data_rows == 0:
        raise TraceError(src, None, None, "no instance rows: the file has only a header")
    end = latest if window_end is None else window_end
    jobs: list[Job] = []
    for sn, created, scheduled, deleted, ngpu, milli, cpus, mem, app in parsed:
        submit = 0.0 if created is None else created
        began = scheduled if scheduled is not None else submit
        stop = end if deleted is None else deleted
        duration = stop - began
        if duration <= 0:
            tally.skip(NON_POSITIVE)
            continue
        # Left-censored (created before the window) or right-censored (alive at its end).
        censored = deleted is None or created is None
        jobs.append(
            Job(
                sn,
                submit,
                duration,
                ngpu,
                milli,
                user=app,
                cpus=cpus,
                mem_mib=mem,
                kind=JobKind.SERVICE,
                duration_censored=censored,
            )
        )
    return Trace(
        jobs,
        source=src,
        skipped_rows=tally.skipped,
        skip_reasons=tally.reasons,
        censored=sum(1 for j in jobs if j.duration_censored),
    )
