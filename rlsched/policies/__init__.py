"""Policies written by hand: the heuristics and the rules, with the ``--policy`` registry.

* :mod:`rlsched.policies.registry` - ``--policy NAME[:KEY=VALUE,...]`` to a scheduler;
* :mod:`rlsched.policies.heuristics` - the heuristic schedulers (importing this package
  registers them);
* :mod:`rlsched.policies.rules` - the rules a learned policy is trained and served behind.

The Scheduler protocol and the decisions are the cluster's (:mod:`rlsched.cluster.scheduler`,
:mod:`rlsched.cluster.decisions`); learned policies are :mod:`rlsched.learned`, above the
environment their codec belongs to.
"""

from rlsched.cluster.scheduler import Scheduler
from rlsched.policies.heuristics import QueueHeuristic
from rlsched.policies.registry import available, make_policy, register

__all__ = ["QueueHeuristic", "Scheduler", "available", "make_policy", "register"]
