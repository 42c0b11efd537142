"""Schedulers: the protocol, the heuristics, and (later) learned and guarded policies."""

from rlsched.policies.base import QueueHeuristic, Scheduler, available, make_policy, register

__all__ = ["QueueHeuristic", "Scheduler", "available", "make_policy", "register"]
