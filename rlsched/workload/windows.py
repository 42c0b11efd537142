"""Cutting, sampling and re-loading traces for experiments and RL episodes.

A months-long trace is too long for one training episode and its load is whatever
the original cluster saw; these helpers cut it into windows and rescale its
arrivals to a chosen offered load on *our* cluster, without touching durations
or request shapes (those are the workload's ground truth).

Offered load is ``GPU-seconds demanded / (capacity x arrival span)`` where the
arrival span is ``last submit - first submit``: arrival rate times mean job size,
the quantity that queueing theory says must stay below 1. Because it is
inversely proportional to the arrival span, rescaling inter-arrival times by a
factor hits a target load exactly. A trace whose jobs all arrive at once has no
arrival span; its span falls back to ``end - start`` (the makespan on an infinite
cluster) so that the load stays finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from rlsched.cluster.job import Job
from rlsched.workload.trace import Trace


def _rebased(job: Job, shift: float, scale: float = 1.0, origin: float = 0.0) -> Job:
    """``job`` with submit ``origin + (submit - origin) * scale - shift``; deadline keeps its slack."""
    submit = origin + (job.submit_time - origin) * scale - shift
    deadline = None if job.deadline is None else submit + (job.deadline - job.submit_time)
    return replace(job, submit_time=submit, deadline=deadline)


def _derived(trace: Trace, jobs: list[Job], suffix: str, keep_skips: bool) -> Trace:
    return Trace(
        jobs,
        source=f"{trace.source}{suffix}",
        skipped_rows=trace.skipped_rows if keep_skips else 0,
        skip_reasons=dict(trace.skip_reasons) if keep_skips else {},
        censored=sum(1 for j in jobs if j.duration_censored),
    )


def window(trace: Trace, start: float, end: float) -> Trace:
    """Jobs submitted in ``[start, end)``, with times re-based so ``start`` is 0.

    Durations are unchanged, so jobs may run past ``end - start``: cutting them
    would turn the window's tail into artificially short jobs. The reader's skip
    counts describe the whole source, not the window, so they are not carried.

    Raises:
        ValueError: ``end <= start``.
    """
    if not end > start:
        raise ValueError(f"window end {end} must be after start {start}")
    jobs = [_rebased(j, start) for j in trace.jobs if start <= j.submit_time < end]
    return _derived(trace, jobs, f"[{start:g}:{end:g}]", keep_skips=False)


def split_windows(trace: Trace, length_s: float, *, stride_s: float | None = None) -> list[Trace]:
    """Consecutive (``stride_s == length_s``, the default) or overlapping windows.

    Windows start at the trace's first submission and step by ``stride_s`` until
    past the last submission; windows without jobs are left out since they cannot
    form an episode.

    Raises:
        ValueError: non-positive ``length_s`` or ``stride_s``.
    """
    stride = length_s if stride_s is None else stride_s
    if length_s <= 0 or stride <= 0:
        raise ValueError(f"window length ({length_s}) and stride ({stride}) must be > 0")
    out: list[Trace] = []
    if not trace.jobs:
        return out
    t0, last = trace.start, trace.last_submit
    if stride == length_s:
        return _partition(trace, t0, length_s)
    k = 0
    while True:
        lo = t0 + k * stride
        if lo > last:
            break
        w = window(trace, lo, lo + length_s)
        if w.jobs:
            out.append(w)
        k += 1
    return out


def _partition(trace: Trace, t0: float, length_s: float) -> list[Trace]:
    """Consecutive windows as a true partition: every job in exactly one window.

    Cutting with ``window(lo, lo + length)`` per window computes each boundary
    twice (``t0 + k*L + L`` and ``t0 + (k+1)*L``), which can differ by an ulp and
    put a job on the boundary in two windows or none. Here a job's window is the
    integer ``floor((submit - t0) / L)``, and its re-based time is clamped into
    ``[0, L)`` against the same rounding.
    """
    groups: dict[int, list[Job]] = {}
    for job in trace.jobs:
        groups.setdefault(math.floor((job.submit_time - t0) / length_s), []).append(job)
    below = math.nextafter(length_s, 0.0)
    out: list[Trace] = []
    for k in sorted(groups):
        lo = t0 + k * length_s
        jobs = []
        for job in groups[k]:
            j = _rebased(job, lo)
            if not 0.0 <= j.submit_time < length_s:
                at = min(max(j.submit_time, 0.0), below)
                j = replace(j, submit_time=at, deadline=None if job.deadline is None else
                            at + (job.deadline - job.submit_time))
            jobs.append(j)
        out.append(_derived(trace, jobs, f"[{lo:g}:{lo + length_s:g}]", keep_skips=False))
    return out


def _arrival_span(jobs: Sequence[Job]) -> float:
    lo = min(j.submit_time for j in jobs)
    hi = max(j.submit_time for j in jobs)
    if hi > lo:
        return hi - lo
    return max(j.submit_time + j.duration for j in jobs) - lo


def offered_load(jobs: Sequence[Job] | Trace, capacity_gpus: float) -> float:
    """GPU-seconds demanded / (capacity x arrival span); 0.0 for no jobs.

    Fractional requests count as their share; CPU-only jobs count 0.

    Raises:
        ValueError: ``capacity_gpus <= 0``.
    """
    if capacity_gpus <= 0:
        raise ValueError(f"capacity must be > 0 GPUs, got {capacity_gpus}")
    seq = jobs.jobs if isinstance(jobs, Trace) else jobs
    if not seq:
        return 0.0
    demand = sum(j.gpu_demand * j.duration for j in seq)
    return demand / (capacity_gpus * _arrival_span(seq))


def scale_to_load(trace: Trace, capacity_gpus: float, target_load: float) -> Trace:
    """Stretch or compress inter-arrival times so the offered load is ``target_load``.

    Arrival order, durations and shapes are unchanged; the first submission keeps
    its time, and deadlines keep their slack relative to submission.

    Raises:
        ValueError: non-positive capacity or target, or a trace whose load cannot be
            changed by moving arrivals (no GPU demand, or all jobs arrive at once).
    """
    if target_load <= 0:
        raise ValueError(f"target load must be > 0, got {target_load}")
    current = offered_load(trace, capacity_gpus)
    if current == 0:
        raise ValueError("the trace demands no GPU time, so no arrival rate gives a positive load")
    if not trace.last_submit > trace.start:
        raise ValueError("all jobs arrive at the same time: there are no inter-arrival times to scale")
    factor = current / target_load
    t0 = trace.start
    jobs = [_rebased(j, 0.0, factor, t0) for j in trace.jobs]
    return _derived(trace, jobs, f"@load{target_load:g}", keep_skips=True)


def take(trace: Trace, max_jobs: int) -> Trace:
    """The first ``max_jobs`` jobs in submission order (for quick runs and tests).

    Raises:
        ValueError: ``max_jobs < 0``.
    """
    if max_jobs < 0:
        raise ValueError(f"max_jobs must be >= 0, got {max_jobs}")
    if max_jobs >= len(trace.jobs):
        return _derived(trace, list(trace.jobs), "", keep_skips=True)
    return _derived(trace, trace.jobs[:max_jobs], f"[:{max_jobs}]", keep_skips=True)
