"""Heuristic teachers expressed in the codec's action space (for behaviour cloning).

DL2 warm-started its RL scheduler by imitating the incumbent. Our incumbent (and
the runtime fallback) is weighted-priority, so the default teacher picks, among
legal place actions, the window job with the highest ``0.6 x priority + 0.4 x wait``
score (normalised over the window) in the cheapest legal pool. The ``sjf`` teacher
picks the window job with the shortest *estimated* duration (the estimator every
scheduler sees, never the true one), oldest first on ties: a stronger starting
point on mean JCT that PPO then has to improve on. With nothing to place, both buy
one node in the cheapest elastic pool that can grow (when none is already
provisioning), else wait. Neither reconfigures MIG.
"""

from __future__ import annotations

import numpy as np

from rlsched.cluster.model import ClusterState, NodeStatus, PoolKind
from rlsched.envs.codec import ObservationCodec

#: teacher names accepted by ``bc.teacher`` in an experiment file
TEACHERS = ("weighted-priority", "sjf")


def teacher_action(codec: ObservationCodec, state: ClusterState, mask: np.ndarray,
                   w_priority: float = 0.6, w_wait: float = 0.4, rule: str = "weighted-priority") -> int:
    """The teacher's choice (``rule``, one of :data:`TEACHERS`) among the legal actions in ``mask``."""
    if rule not in TEACHERS:
        raise ValueError(f"unknown teacher {rule!r} (one of {', '.join(TEACHERS)})")
    k_slots, p_slots = codec.window, codec.max_pools
    runs = codec.window_runs(state)
    pools = list(state.pools.values())[:p_slots]

    def pool_cost(p: int) -> tuple[int, float]:
        pool = pools[p]
        if pool.spec.kind is PoolKind.ONPREM:
            return (0, 0.0)
        q = state.quotes.get(pool.name)
        return (1, q.price_per_gpu_hour if q else 0.0)

    order = sorted(range(len(pools)), key=pool_cost)
    if runs:
        now = state.time
        prios = [r.job.priority for r in runs]
        waits = [now - r.job.submit_time for r in runs]
        pmin, pmax, wmax = min(prios), max(prios), max(waits)
        if rule == "sjf":
            est = state.estimator.estimate
            # highest score first: shortest estimate, then the longest wait, then slot order
            scores = [(-est(r.job), w, -i) for i, (r, w) in enumerate(zip(runs, waits, strict=True))]
        else:
            scores = [
                (w_priority * ((p - pmin) / (pmax - pmin) if pmax > pmin else 0.0)
                 + w_wait * (w / wmax if wmax > 0 else 0.0), 0.0, -i)
                for i, (p, w) in enumerate(zip(prios, waits, strict=True))
            ]
        for *_, neg_i in sorted(scores, reverse=True):
            k = -neg_i
            for p in order:
                a = k * p_slots + p
                if mask[a]:
                    return a
        # nothing placeable: buy capacity if no pool is already provisioning
        if not any(n.status is NodeStatus.PROVISIONING for n in state.nodes.values()):
            for p in order:
                if pools[p].spec.kind is PoolKind.ONPREM:
                    continue
                a = codec.scale_offset + 2 * p
                if mask[a]:
                    return a
    del k_slots
    return codec.wait_action
