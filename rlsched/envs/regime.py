"""Regime features: a handful of numbers that say which kind of scheduling a cluster needs now.

A heuristic selector (:mod:`rlsched.learned.selector`) does not score jobs; it chooses which
heuristic schedules the next stretch of time. What that choice depends on is the *regime*:
how deep the backlog is against the fleet, whether the duration estimates can be trusted
(shortest-first by a poor estimate loses to weighted-priority), how mixed the queued
durations are (the gain of shortest-first grows with the spread), whether one tenant
dominates the queue (fair-share's case), how much of it is fractional or gang-sized. The
estimator's error reads 0 before any job has finished, so two features say how much it knows:
how many finishes the error is measured over, and how much of the queue belongs to users it has
never seen finish (a cold start with a backlog looks like perfect estimates otherwise).

Every feature is a ratio, a share or a logarithm of one, so it keeps its range when the
fleet grows from 4 to 128 nodes or the queue from 10 to 10,000 jobs: a network trained on
8-32 node worlds reads the same numbers on a 4-node or a 128-node cluster (issue 16's
"features whose range at deployment lies outside training"). The fleet's size itself is
deliberately not a feature: a network reading it extrapolates on fleet sizes it never
trained on (BENCHMARKS.md, "A learned heuristic selector"). Each feature is clipped to ``[0, CLIP]``.
"""

from __future__ import annotations

import math

import numpy as np

from rlsched.cluster.model import ClusterState

#: upper clip of every feature (logarithms of ratios stay far below it in practice)
CLIP = 6.0

#: names of :func:`regime_features`' entries, in order
REGIME_FEATURES: tuple[str, ...] = (
    "log_queued_gpus_per_gpu",   # log1p(queued GPU demand / fleet GPUs): backlog against capacity
    "log_queued_jobs_per_node",  # log1p(queued jobs / nodes): how many orderings there are to choose from
    "utilisation",               # allocated / capacity
    "offered_load",              # recent arrivals x mean estimated duration / capacity
    "estimate_log_error",        # the estimator's running mean |log(actual / estimate)|
    "log_estimate_spread",       # std of log(estimated duration) over the queue
    "log_wait_per_estimate",     # log1p(mean queued wait / median queued estimate): starvation pressure
    "top_user_share",            # the largest tenant's share of the queue
    "fractional_share",          # queued jobs asking for less than one GPU
    "gang_share",                # queued jobs asking for more GPUs than the largest node has
    "estimator_confidence",      # finished jobs the error is known over, n / (n + 20): 0 on a cold start
    "unestimated_share",         # queued jobs whose user has no finished job (their estimate is a guess)
)


def _clip(x: float) -> float:
    if not math.isfinite(x):
        return CLIP
    return min(max(x, 0.0), CLIP)


def regime_features(state: ClusterState) -> np.ndarray:
    """The :data:`REGIME_FEATURES` of ``state`` as a float32 vector (O(queue length))."""
    capacity = max(state.capacity_gpus(), 1)
    nodes = max(len(state.nodes), 1)
    biggest = max((len(n.gpus) for n in state.nodes.values()), default=1)
    est = state.estimator
    queue = list(state.queue.values())
    now = state.time
    out = np.zeros(len(REGIME_FEATURES), dtype=np.float32)
    out[2] = _clip(state.allocated / capacity)
    out[4] = _clip(est.log_error)
    out[10] = est.scored / (est.scored + 20.0)
    demand = 0.0
    log_est: list[float] = []
    waits = 0.0
    users: dict[str, int] = {}
    fractional = gang = unknown = 0
    for run in queue:
        job = run.job
        demand += job.gpu_demand
        log_est.append(math.log(max(est.estimate(job), 1.0)))
        waits += max(now - run.enqueued_at, 0.0)
        users[job.user] = users.get(job.user, 0) + 1
        fractional += job.gpu_demand < 1.0
        gang += job.num_gpus > biggest
        unknown += not est.knows(job)
    out[0] = _clip(math.log1p(demand / capacity))
    out[1] = _clip(math.log1p(len(queue) / nodes))
    if queue:
        n = len(queue)
        arr = np.asarray(log_est)
        out[5] = _clip(float(arr.std()))
        median_est = math.exp(float(np.median(arr)))
        out[6] = _clip(math.log1p(waits / n / median_est))
        out[7] = max(users.values()) / n
        out[8] = fractional / n
        out[9] = gang / n
        out[11] = unknown / n
        mean_est_h = math.exp(float(arr.mean())) / 3600.0
    else:
        mean_est_h = 1.0
    out[3] = _clip(state.arrival_rate(now) * mean_est_h / capacity)
    return out
