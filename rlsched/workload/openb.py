"""Readers of Alibaba's "openb" GPU-sharing trace (cluster-trace-gpu-v2023).

Pod lists (``openb_pod_list_*.csv``) have the columns ``name, cpu_milli,
memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase, creation_time,
deletion_time, scheduled_time``; times are seconds from the trace start. Node
lists (``openb_node_list_*.csv``) have ``sn, cpu_milli, memory_mib, gpu, model``.

Pod mapping, and why:

* ``submit_time = creation_time``; ``duration = deletion_time - scheduled_time``
  (the time the pod held its GPU), or ``deletion_time - creation_time`` when the
  pod was never scheduled (``Pending`` pods: the trace has no run time for them,
  so the time until deletion is the only observed quantity).
* **Right censoring.** A pod whose ``pod_phase`` is ``Running`` had not finished
  when the trace was taken: its ``deletion_time`` is where observation stopped,
  so its duration is only a lower bound. We keep that lower bound as the duration
  and mark ``duration_censored=True`` (counted in ``Trace.censored``); we do NOT
  invent a longer duration, because any extrapolation would be a modelling choice
  that belongs to the experiment, not to the reader.
* Zero-duration pods are dropped and counted under ``"zero duration"``: FORMAT.md
  requires ``duration > 0`` and such pods never held a GPU. A *negative* duration
  (deletion before scheduling) is a broken row.
* ``gpu_milli`` is kept for ``num_gpu == 1`` (a fractional request when < 1000);
  multi-GPU pods ask for whole GPUs; ``num_gpu == 0`` pods are kept as CPU-only
  jobs (the simulator counts them as skipped).
* ``gpu_spec`` (``|``-separated, empty = any) resolves through the catalogue
  (``V100M16`` -> ``V100-16GB`` ...); an unknown model is a bad row.
* ``qos`` -> ``priority``: ``LS`` (latency-sensitive) and ``Guaranteed`` = 2,
  ``Burstable`` = 1, ``BE`` (best effort) = 0, following Kubernetes' QoS order;
  ``BE`` pods are also ``preemptible`` since best effort is what may be evicted.
  An empty qos is priority 0; an unknown value is a bad row.
* ``cpus = cpu_milli / 1000``, ``mem_mib = memory_mib``.

The ``multigpu50`` variant has only the first five columns: without times it
cannot be replayed, and this reader refuses it rather than fabricating arrivals.
"""

from __future__ import annotations

from pathlib import Path

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.job import Job
from rlsched.cluster.model import PoolKind, PoolSpec
from rlsched.errors import TraceError, UnknownGpuModelError
from rlsched.workload._csvio import (
    ModelCache,
    RowError,
    Tally,
    header_index,
    no_gc,
    open_text,
    optional_float,
    parse_float,
    parse_int,
    rows,
    shown,
)
from rlsched.workload.table_reader import read_table
from rlsched.workload.trace import Trace

POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")

#: Kubernetes QoS class / Alibaba qos -> (priority, preemptible).
QOS_PRIORITY: dict[str, tuple[int, bool]] = {
    "LS": (2, False),
    "Guaranteed": (2, False),
    "Burstable": (1, False),
    "BE": (0, True),
    "": (0, False),
}
_QOS_LOWER = {k.lower(): v for k, v in QOS_PRIORITY.items()}

ZERO_DURATION = "zero duration"


def read_openb_pods(path: str | Path, *, skip_bad_rows: bool = False) -> Trace:
    """Read an openb pod list as a trace (see the module docstring for the mapping).

    Args:
        path: an ``openb_pod_list_*.csv`` with timing columns.
        skip_bad_rows: count malformed rows instead of raising.

    Raises:
        TraceError: missing file or columns, no timing columns (``multigpu50``),
            or a bad row unless ``skip_bad_rows``.
    """
    return read_table(path, _PodTable(), skip_bad_rows=skip_bad_rows)


class _PodTable:
    """The openb pod-list parts of :func:`~rlsched.workload.table_reader.read_table`: one pod, one job."""

    what = "openb pod list"
    required = POD_COLUMNS
    empty_message = "empty file: expected an openb pod-list header"
    no_rows_message = "no pod rows: the file has only a header"

    def __init__(self) -> None:
        self.models = ModelCache()
        self.seen: set[str] = set()
        self.cols: tuple[int, ...] = ()
        self.optional: tuple[int | None, int | None, int | None] = (None, None, None)

    def columns(self, src: str, header: list[str], index: dict[str, int]) -> int:
        """Refuse a pod list without timing columns; a row needs every pod and time column."""
        missing = [c for c in TIME_COLUMNS if c not in index]
        if missing:
            raise TraceError(
                src,
                1,
                missing[0],
                "the file has no timing columns (creation_time, deletion_time, scheduled_time), so it "
                "cannot be replayed as a trace; use a pod list with times (e.g. openb_pod_list_default.csv)",
            )
        self.cols = tuple(index[c] for c in POD_COLUMNS + TIME_COLUMNS)
        self.optional = (index.get("gpu_spec"), index.get("qos"), index.get("pod_phase"))
        return max(self.cols) + 1

    def parse_row(self, line: int, fields: list[str], tally: Tally) -> Job | None:
        """The pod's job; None for a zero-duration pod (counted); RowError for a bad field or a repeated name."""
        i_name, i_cpu, i_mem, i_ng, i_milli, i_create, i_delete, i_sched = self.cols
        i_spec, i_qos, i_phase = self.optional
        name = fields[i_name].strip()
        if not name:
            raise RowError("name", "empty pod name")
        cpu_milli = parse_float(fields[i_cpu], "cpu_milli")
        mem = parse_int(fields[i_mem], "memory_mib")
        ngpu = parse_int(fields[i_ng], "num_gpu")
        if ngpu < 0:
            raise RowError("num_gpu", f"num_gpu must be >= 0, got {ngpu}")
        milli = _gpu_milli(fields[i_milli], ngpu)
        gmodels = self.models(fields[i_spec], "gpu_spec") if i_spec is not None else frozenset()
        priority, preemptible = _qos(fields[i_qos] if i_qos is not None else "")
        created = parse_float(fields[i_create], "creation_time")
        deleted = parse_float(fields[i_delete], "deletion_time")
        scheduled = optional_float(fields[i_sched], "scheduled_time")
        began = created if scheduled is None else scheduled
        duration = deleted - began
        if duration < 0:
            raise RowError("deletion_time", f"deletion_time {deleted:g} is before the pod started ({began:g})")
        if duration == 0:
            tally.skip(ZERO_DURATION)
            return None
        if name in self.seen:
            raise RowError("name", f"duplicate pod name {shown(name)}")
        self.seen.add(name)
        phase = fields[i_phase].strip() if i_phase is not None else ""
        return Job(
            name,
            created,
            duration,
            ngpu,
            milli,
            gmodels,
            priority=priority,
            preemptible=preemptible,
            cpus=cpu_milli / 1000.0,
            mem_mib=mem,
            duration_censored=phase.lower() == "running",
        )

    def jobs(self, src: str, parsed: list[Job], tally: Tally) -> list[Job]:
        """The pods' jobs as parsed."""
        return parsed


def _gpu_milli(text: str, ngpu: int) -> int:
    """A 1-GPU pod's share of its GPU (default a whole one); multi-GPU pods take whole GPUs."""
    milli = parse_int(text, "gpu_milli") if text.strip() else 1000
    if ngpu != 1:
        return 1000
    if not 1 <= milli <= 1000:
        raise RowError("gpu_milli", f"gpu_milli must be in 1..1000 for a 1-GPU pod, got {milli}")
    return milli


def _qos(text: str) -> tuple[int, bool]:
    """``(priority, preemptible)`` of a qos cell (see :data:`QOS_PRIORITY`)."""
    qos = text.strip()
    mapped = _QOS_LOWER.get(qos.lower())
    if mapped is None:
        raise RowError("qos", f"unknown qos {shown(qos)}; known: {', '.join(q for q in QOS_PRIORITY if q)}")
    return mapped


def _pool_name(model: str, gpus: int) -> str:
    return f"openb-{model.lower()}-{gpus}g"


def read_openb_nodes(path: str | Path) -> list[PoolSpec]:
    """Group an openb node list into fixed on-prem pools of identical nodes.

    Nodes with the same (model, GPUs, CPUs, memory) are interchangeable for
    placement, so each such group becomes one ``PoolKind.ONPREM`` pool with
    ``min_nodes == max_nodes == count``. GPU-less nodes are skipped: the scheduler
    only places GPU work. Pools are ordered by node count (largest first) and named
    ``openb-<model>-<gpus>g`` (e.g. ``openb-v100-16gb-8g``); when two groups share a
    name (same model and GPU count, different host resources) the later ones get
    ``-2``, ``-3``... suffixes.

    Raises:
        TraceError: missing file or column, a malformed row, or an unknown model.
    """
    src = str(path)
    groups: dict[tuple[str, int, float, int], int] = {}
    with no_gc(), open_text(path) as fh:
        it = rows(fh, src)
        first = next(it, None)
        if first is None:
            raise TraceError(src, None, None, "empty file: expected an openb node-list header")
        header = first[1]
        idx = header_index(header, src, NODE_COLUMNS, "openb node list")
        i_cpu, i_mem, i_gpu, i_model = idx["cpu_milli"], idx["memory_mib"], idx["gpu"], idx["model"]
        need = max(idx.values()) + 1
        for line, f in it:
            if len(f) < need:
                raise TraceError(src, line, None, f"row has {len(f)} fields, the header has {len(header)}")
            try:
                gpus = parse_int(f[i_gpu], "gpu")
                if gpus < 0:
                    raise RowError("gpu", f"gpu must be >= 0, got {gpus}")
                if gpus == 0:
                    continue
                cpus = parse_float(f[i_cpu], "cpu_milli") / 1000.0
                mem = parse_int(f[i_mem], "memory_mib")
                text = f[i_model].strip()
                if not text:
                    raise RowError("model", f"a node with {gpus} GPUs has no model")
                try:
                    model = gpu_model(text).name
                except UnknownGpuModelError as exc:
                    raise RowError("model", str(exc)) from None
            except RowError as exc:
                raise TraceError(src, line, exc.column, exc.message) from None
            key = (model, gpus, cpus, mem)
            groups[key] = groups.get(key, 0) + 1
    pools: list[PoolSpec] = []
    used: dict[str, int] = {}
    for (model, gpus, cpus, mem), count in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
        base = _pool_name(model, gpus)
        used[base] = used.get(base, 0) + 1
        name = base if used[base] == 1 else f"{base}-{used[base]}"
        pools.append(
            PoolSpec(
                name=name,
                kind=PoolKind.ONPREM,
                model=gpu_model(model),
                gpus_per_node=gpus,
                min_nodes=count,
                max_nodes=count,
                cpus_per_node=cpus,
                mem_mib_per_node=mem,
            )
        )
    return pools
