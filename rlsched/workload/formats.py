"""Format detection and the one entry point every ``--trace`` option goes through.

Detection looks only at the header row: the supported formats have disjoint
required columns, so the header is unambiguous and detection costs one line even
on a million-row file. The canonical format is tried first, so a canonical file
that happens to carry extra columns of another format is still read as canonical.
"""

from __future__ import annotations

import csv
from pathlib import Path

from rlsched.errors import TraceError
from rlsched.workload._csvio import open_text
from rlsched.workload.canonical import read_canonical
from rlsched.workload.dlrm import read_dlrm_services
from rlsched.workload.openb import read_openb_pods
from rlsched.workload.philly import read_philly
from rlsched.workload.trace import Trace

FORMATS = ("canonical", "philly", "openb", "dlrm")

_SIGNATURES: tuple[tuple[str, frozenset[str]], ...] = (
    ("canonical", frozenset({"submit_time", "duration", "num_gpus"})),
    ("philly", frozenset({"timestamp", "duration", "num_gpus", "cluster"})),
    ("dlrm", frozenset({"instance_sn", "gpu_request", "creation_time"})),
    ("openb", frozenset({"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"})),
)
_OPENB_NODES = frozenset({"sn", "cpu_milli", "memory_mib", "gpu", "model"})


def _header(path: str | Path) -> list[str]:
    src = str(path)
    with open_text(path) as fh:
        try:
            for fields in csv.reader(fh):
                if fields and any(x.strip() for x in fields):
                    return [x.strip() for x in fields]
        except UnicodeDecodeError:
            raise TraceError(src, 1, None, "not UTF-8 text") from None
        except csv.Error as exc:
            raise TraceError(src, 1, None, f"malformed CSV header: {exc}") from None
    raise TraceError(src, None, None, "empty file: expected a header row and job rows")


def detect_format(path: str | Path) -> str:
    """The trace format of ``path`` from its header: one of :data:`FORMATS`.

    Raises:
        TraceError: missing or empty file, an openb node list (a cluster, not a
            trace), or a header no reader recognises (the message lists the formats).
    """
    cols = set(_header(path))
    for name, needed in _SIGNATURES:
        if needed <= cols:
            return name
    if cols >= _OPENB_NODES:
        raise TraceError(str(path), 1, None, "this is an openb node list (a cluster description), not a job trace")
    raise TraceError(
        str(path),
        1,
        None,
        "unrecognised trace header; supported formats: canonical (submit_time, duration, num_gpus, ...), "
        "philly (timestamp, duration, num_gpus, cluster), openb (name, cpu_milli, memory_mib, num_gpu, "
        "gpu_milli, ..., creation_time, deletion_time, scheduled_time), dlrm (instance_sn, gpu_request, "
        "creation_time, scheduled_time, deletion_time)",
    )


def load_trace(
    path: str | Path,
    fmt: str = "auto",
    *,
    skip_bad_rows: bool = False,
    virtual_cluster: str | None = None,
) -> Trace:
    """Read a trace in any supported format (``fmt="auto"`` detects it).

    Args:
        path: the trace file.
        fmt: ``"auto"`` or one of :data:`FORMATS`.
        skip_bad_rows: count malformed rows instead of raising.
        virtual_cluster: Philly only: keep one virtual cluster.

    Raises:
        TraceError: unknown ``fmt``, missing file, unrecognised header, a
            ``virtual_cluster`` for a non-Philly trace, or any reader error.
    """
    src = str(path)
    if fmt not in ("auto", *FORMATS):
        raise TraceError(src, None, None, f"unknown trace format {fmt!r}; supported: auto, {', '.join(FORMATS)}")
    if not Path(path).exists():
        raise TraceError(src, None, None, "file not found")
    kind = detect_format(path) if fmt == "auto" else fmt
    if virtual_cluster is not None and kind != "philly":
        raise TraceError(src, None, None, f"a virtual cluster applies to philly traces only, this is {kind}")
    if kind == "canonical":
        return read_canonical(path, skip_bad_rows=skip_bad_rows)
    if kind == "philly":
        return read_philly(path, virtual_cluster=virtual_cluster, skip_bad_rows=skip_bad_rows)
    if kind == "openb":
        return read_openb_pods(path, skip_bad_rows=skip_bad_rows)
    return read_dlrm_services(path, skip_bad_rows=skip_bad_rows)
