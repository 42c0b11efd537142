"""Reader and writer of the canonical job-trace CSV (``shared/data/FORMAT.md``).

Every command that takes ``--trace`` accepts this format, so the reader is strict:
a row that breaks the table of FORMAT.md raises a
:class:`~rlsched.errors.TraceError` naming file, physical line and column, unless
``skip_bad_rows`` asks for such rows to be counted instead. Strictness is what
makes a million-row replay trustworthy: a silently mis-parsed duration would skew
every metric downstream.

Choices the format leaves open, and why:

* ``num_gpus == 0`` rows are kept as CPU-only jobs; the simulator counts them as
  skipped, so the number is visible in its report rather than lost here.
* ``gpu_milli`` of ``0`` is accepted only on ``num_gpus == 0`` rows (exports of the
  Alibaba traces write it for CPU-only pods) and read as the default 1000.
* An empty ``job_id`` (or no such column) becomes the 1-based data-row number.
* Integers written as ``2.0`` are accepted (pandas writes them so); ``2.5`` is not.
* Besides the FORMAT.md columns the writer adds rlsched extension columns only
  when some job needs them (``cpus``, ``mem_mib``, ``kind``,
  ``checkpoint_interval``, ``duration_censored``); other tools ignore them as
  unknown columns, and this reader reads them back so that a
  convert -> read round trip is lossless.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path

from rlsched.cluster.job import Job, JobKind
from rlsched.errors import TraceError
from rlsched.posix import atomic_write
from rlsched.workload._csvio import (
    MAX_FLOAT,
    MAX_INT,
    ModelCache,
    RowError,
    Tally,
    header_index,
    no_gc,
    open_text,
    parse_float,
    parse_int,
    rows,
    shown,
)
from rlsched.workload.trace import Trace

REQUIRED = ("submit_time", "duration", "num_gpus")

_TRUE = frozenset({"1", "true", "True", "TRUE", "yes"})
_FALSE = frozenset({"0", "false", "False", "FALSE", "no", ""})
_KINDS = {k.value: k for k in JobKind}


def _bool(text: str, column: str) -> bool:
    text = text.strip()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise RowError(column, f"must be 0 or 1, got {shown(text)}")


def read_canonical(path: str | Path, *, skip_bad_rows: bool = False) -> Trace:
    """Read a canonical job-trace CSV.

    Args:
        path: the CSV file (``.gz`` is decompressed).
        skip_bad_rows: count rows that break the format in ``skipped_rows`` /
            ``skip_reasons["bad row"]`` instead of raising.

    Returns:
        The jobs sorted by submit time (rows need not be sorted in the file).

    Raises:
        TraceError: file missing, empty, header only, a required column missing, or
            (without ``skip_bad_rows``) any bad row, duplicate ``job_id`` included.
    """
    src = str(path)
    tally = Tally(src, skip_bad_rows)
    jobs: list[Job] = []
    models = ModelCache()
    seen: dict[str, int] = {}
    data_rows = 0
    with no_gc(), open_text(path) as fh:
        it = rows(fh, src)
        first = next(it, None)
        if first is None:
            raise TraceError(src, None, None, "empty file: expected a header row and job rows")
        header = first[1]
        idx = header_index(header, src, REQUIRED, "canonical trace")
        ncols = len(header)
        i_submit, i_dur, i_ngpu = idx["submit_time"], idx["duration"], idx["num_gpus"]
        i_id = idx.get("job_id")
        i_milli = idx.get("gpu_milli")
        i_model = idx.get("gpu_model")
        i_prio = idx.get("priority")
        i_user = idx.get("user")
        i_pre = idx.get("preemptible")
        i_dl = idx.get("deadline")
        i_cpus = idx.get("cpus")
        i_mem = idx.get("mem_mib")
        i_kind = idx.get("kind")
        i_ckpt = idx.get("checkpoint_interval")
        i_cens = idx.get("duration_censored")
        batch = JobKind.BATCH
        for line, f in it:
            data_rows += 1
            if len(f) != ncols and (len(f) < ncols or any(x.strip() for x in f[ncols:])):
                tally.bad(line, None, f"row has {len(f)} fields, the header has {ncols}")
                continue
            try:
                # Fast path: plain float()/int() on the three hot columns; the
                # checked parsers only run to word the error or accept "2.0".
                try:
                    submit = float(f[i_submit])
                    duration = float(f[i_dur])
                    ngpu = int(f[i_ngpu])
                except ValueError:
                    submit = parse_float(f[i_submit], "submit_time")
                    duration = parse_float(f[i_dur], "duration")
                    ngpu = parse_int(f[i_ngpu], "num_gpus")
                if not -MAX_FLOAT <= submit <= MAX_FLOAT:  # NaN, infinity or out of range: word it
                    parse_float(f[i_submit], "submit_time")
                if not -MAX_FLOAT <= duration <= MAX_FLOAT:
                    parse_float(f[i_dur], "duration")
                if not -MAX_INT <= ngpu <= MAX_INT:
                    parse_int(f[i_ngpu], "num_gpus")
                if duration <= 0:
                    raise RowError("duration", f"duration must be > 0, got {duration:g}")
                if ngpu < 0:
                    raise RowError("num_gpus", f"num_gpus must be >= 0, got {ngpu}")
                milli = 1000
                if i_milli is not None:
                    text = f[i_milli].strip()
                    if text:
                        milli = parse_int(text, "gpu_milli")
                        if milli == 0 and ngpu == 0:
                            milli = 1000
                        elif not 1 <= milli <= 1000:
                            raise RowError("gpu_milli", f"gpu_milli must be in 1..1000, got {milli}")
                gmodels = models(f[i_model], "gpu_model") if i_model is not None else frozenset()
                prio = 0
                if i_prio is not None:
                    text = f[i_prio].strip()
                    if text:
                        prio = parse_int(text, "priority")
                pre = _bool(f[i_pre], "preemptible") if i_pre is not None else False
                deadline = None
                if i_dl is not None:
                    text = f[i_dl].strip()
                    if text:
                        deadline = parse_float(text, "deadline")
                cpus = 0.0
                if i_cpus is not None and f[i_cpus].strip():
                    cpus = parse_float(f[i_cpus], "cpus")
                    if cpus < 0:
                        raise RowError("cpus", f"cpus must be >= 0, got {cpus}")
                mem = 0
                if i_mem is not None and f[i_mem].strip():
                    mem = parse_int(f[i_mem], "mem_mib")
                    if mem < 0:
                        raise RowError("mem_mib", f"mem_mib must be >= 0, got {mem}")
                kind = batch
                if i_kind is not None and f[i_kind].strip():
                    k = _KINDS.get(f[i_kind].strip().lower())
                    if k is None:
                        raise RowError("kind", f"kind must be one of {', '.join(_KINDS)}, got {shown(f[i_kind])}")
                    kind = k
                ckpt = None
                if i_ckpt is not None and f[i_ckpt].strip():
                    ckpt = parse_float(f[i_ckpt], "checkpoint_interval")
                    if ckpt <= 0:
                        raise RowError("checkpoint_interval", f"checkpoint_interval must be > 0, got {ckpt}")
                cens = _bool(f[i_cens], "duration_censored") if i_cens is not None else False
            except RowError as exc:
                tally.bad(line, exc.column, exc.message)
                continue
            job_id = f[i_id].strip() if i_id is not None else ""
            if not job_id:
                job_id = str(data_rows)
            prev = seen.get(job_id)
            if prev is not None:
                tally.bad(line, "job_id", f"duplicate job_id {shown(job_id)} (first on line {prev})")
                continue
            seen[job_id] = line
            jobs.append(
                Job(
                    job_id,
                    submit,
                    duration,
                    ngpu,
                    milli,
                    gmodels,
                    prio,
                    f[i_user].strip() if i_user is not None else "",
                    pre,
                    deadline,
                    cpus,
                    mem,
                    kind,
                    ckpt,
                    cens,
                )
            )
    if data_rows == 0:
        raise TraceError(src, None, None, "no job rows: the file has only a header")
    return tally.trace(jobs)


def _num(x: float) -> str:
    """Shortest text that reads back to exactly ``x`` (``repr``), without a trailing ``.0``."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def write_canonical(path: str | Path, jobs: Iterable[Job]) -> int:
    """Write jobs as a canonical CSV; returns the number of jobs written.

    Only columns some job needs are written, so simple traces stay simple, yet
    ``read_canonical(write_canonical(p, jobs))`` gives back equal jobs. The file is
    written to a temporary name and renamed, so a failed conversion never leaves a
    truncated trace behind.

    Raises:
        TraceError: the destination cannot be written.
    """
    jobs = list(jobs)
    cols = ["job_id", "submit_time", "duration", "num_gpus"]
    optional = {
        "gpu_milli": any(j.gpu_milli != 1000 for j in jobs),
        "gpu_model": any(j.gpu_models for j in jobs),
        "priority": any(j.priority != 0 for j in jobs),
        "user": any(j.user for j in jobs),
        "preemptible": any(j.preemptible for j in jobs),
        "deadline": any(j.deadline is not None for j in jobs),
        "cpus": any(j.cpus for j in jobs),
        "mem_mib": any(j.mem_mib for j in jobs),
        "kind": any(j.kind is not JobKind.BATCH for j in jobs),
        "checkpoint_interval": any(j.checkpoint_interval is not None for j in jobs),
        "duration_censored": any(j.duration_censored for j in jobs),
    }
    cols += [c for c, needed in optional.items() if needed]
    getters = {
        "job_id": lambda j: j.job_id,
        "submit_time": lambda j: _num(j.submit_time),
        "duration": lambda j: _num(j.duration),
        "num_gpus": lambda j: str(j.num_gpus),
        "gpu_milli": lambda j: "" if j.gpu_milli == 1000 else str(j.gpu_milli),
        "gpu_model": lambda j: "|".join(sorted(j.gpu_models)),
        "priority": lambda j: str(j.priority),
        "user": lambda j: j.user,
        "preemptible": lambda j: "1" if j.preemptible else "0",
        "deadline": lambda j: "" if j.deadline is None else _num(j.deadline),
        "cpus": lambda j: _num(j.cpus) if j.cpus else "",
        "mem_mib": lambda j: str(j.mem_mib) if j.mem_mib else "",
        "kind": lambda j: j.kind.value,
        "checkpoint_interval": lambda j: "" if j.checkpoint_interval is None else _num(j.checkpoint_interval),
        "duration_censored": lambda j: "1" if j.duration_censored else "0",
    }
    row_of = [getters[c] for c in cols]
    text = io.StringIO(newline="")
    w = csv.writer(text, lineterminator="\n")
    w.writerow(cols)
    w.writerows([get(j) for get in row_of] for j in jobs)
    try:
        atomic_write(path, text.getvalue(), mode=0o644)  # a trace is not private: other users may read it
    except OSError as exc:
        raise TraceError(str(path), None, None, f"cannot write: {exc.strerror or exc}") from None
    return len(jobs)
