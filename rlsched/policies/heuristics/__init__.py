"""The heuristic schedulers: a queue order, a placement rule and a scaling rule each.

Importing this package registers every built-in heuristic under its ``--policy`` name
(:mod:`rlsched.policies.registry`) and makes weighted-priority the heuristic that finishes a
decision point a learned policy loops at (:func:`rlsched.cluster.loop_detector.set_default_fallback`).

* :mod:`~rlsched.policies.heuristics.queue` - the skeleton they share (:class:`QueueHeuristic`)
  and dynamic MIG re-splitting for blocked jobs;
* :mod:`~rlsched.policies.heuristics.placement` - first-fit, best-fit, fragmentation-aware placement;
* :mod:`~rlsched.policies.heuristics.autoscale` - queue- and forecast-driven scaling of elastic pools;
* :mod:`~rlsched.policies.heuristics.classic` - weighted-priority, FIFO, SJF, best-fit, FGD, fair-share,
  spot-fallback;
* :mod:`~rlsched.policies.heuristics.tiresias` - Tiresias 2D-LAS;
* :mod:`~rlsched.policies.heuristics.spot` - the spot baselines (on-demand static/autoscaled, spot-greedy);
* :mod:`~rlsched.policies.heuristics.uniform_progress` - deadline-aware spot use (uniform progress).
"""

from rlsched.cluster.loop_detector import set_default_fallback
from rlsched.policies.heuristics.classic import (
    BestFit,
    FairShare,
    Fifo,
    FragmentationGradient,
    ShortestJobFirst,
    SpotFallback,
    WeightedPriority,
)
from rlsched.policies.heuristics.queue import QueueHeuristic
from rlsched.policies.heuristics.spot import OnDemandAutoscale, OnDemandStatic, SpotGreedy
from rlsched.policies.heuristics.tiresias import Tiresias
from rlsched.policies.heuristics.uniform_progress import UniformProgress

set_default_fallback(WeightedPriority)

__all__ = [
    "BestFit", "FairShare", "Fifo", "FragmentationGradient", "OnDemandAutoscale", "OnDemandStatic",
    "QueueHeuristic", "ShortestJobFirst", "SpotFallback", "SpotGreedy", "Tiresias", "UniformProgress",
    "WeightedPriority",
]
