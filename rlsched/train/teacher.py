"""Heuristic teachers driven like schedulers, and the per-world pick among follow teachers.

What each teacher chooses lives in :mod:`rlsched.envs.teacher_actions` (the codec needs it too:
an anchored codec shows the network its teacher's choice); this module runs a teacher
through the codec's decision loop (:class:`TeacherScheduler`) and picks, per training
world, the follow teacher to imitate (:func:`best_follow_rules`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from rlsched.cluster.decisions import Decision
from rlsched.cluster.model import ClusterState
from rlsched.envs.codec import ObservationCodec
from rlsched.envs.teacher_actions import (
    AT_RISK_WAIT_S,
    FOLLOW,
    PICKERS,
    TEACHERS,
    acting_teachers,
    acts_itself,
    at_risk,
    is_teacher,
    teacher_action,
)
from rlsched.envs.trained_actions import TrainedActions
from rlsched.policies.rules import RuleParams, build_rules, owned_actions

__all__ = ["AT_RISK_WAIT_S", "FOLLOW", "PICKERS", "TEACHERS", "TeacherScheduler", "acts_itself", "at_risk",
           "best_follow_rules", "is_teacher", "teacher_action"]


class TeacherScheduler:
    """A teacher driven like any scheduler, through the codec (window, mask, decode).

    It runs the same decision loop as :class:`~rlsched.learned.ppo.PpoScheduler`, with
    :func:`teacher_action` in place of the network, so evaluation can put "the policy
    PPO was cloned from" beside the trained policy: the clone's agreement says how well
    it imitates, this row says what imitation alone would score. ``preempt_slots`` gives its
    codec running slots (see the module doc for what the follow teachers do with them).
    """

    #: decisions at most per decision point (as the served policy's loop)
    max_actions = 256

    def __init__(self, rule: str, window: int = 16, max_pools: int = 4, rules: RuleParams | None = None,
                 nominators: tuple[str, ...] = (), preempt_slots: int = 0) -> None:
        if not acts_itself(rule, nominators):
            raise ValueError(f"unknown teacher {rule!r} (one of {', '.join(acting_teachers())}, follow:NAME)")
        self.rule = rule
        self.name = f"teacher:{rule}"
        self.window, self.max_pools = window, max_pools
        self.nominators = nominators
        self.preempt_slots = preempt_slots
        #: the experiment's rules, run first as in the environment the teacher was rolled in
        self.rules = build_rules(rules)
        #: the actions the rules own are masked, as in that environment
        self._trained = TrainedActions.behind_rules(owned_actions(rules), "teacher")
        self.codec = self._new_codec()

    def _new_codec(self) -> ObservationCodec:
        return ObservationCodec(window=self.window, max_pools=self.max_pools, nominators=self.nominators,
                                preempt_slots=self.preempt_slots).restrict(self._trained)

    def reset(self, state: ClusterState) -> None:
        self.codec = self._new_codec()
        for r in self.rules:
            r.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        from rlsched.learned.ppo import decide_through_codec

        codec = self.codec
        yield from decide_through_codec(codec, state, lambda mask: teacher_action(codec, state, mask, rule=self.rule),
                                        self.max_actions, rules=self.rules)


def best_follow_rules(envs: list[Any], nominators: tuple[str, ...], episodes: int = 3,
                      seed: int = 0, margin: float = 0.03, jobs: int | None = None) -> list[str]:
    """For each training environment, the ``follow:NAME`` teacher with the lowest mean JCT on it.

    No heuristic is best everywhere (SJF on a small congested fleet, fair-share where a
    few users flood the queue, weighted-priority where estimates mislead), so the
    ``best-follow`` teacher imitates, in each training world, the nominator that
    scheduled that world best over ``episodes`` episodes of the same seeds. The network
    then has to learn from what it observes which ordering the moment calls for; these
    are training worlds only, never evaluation ones.

    The first nominator is the default: another one is taught only where it beats the
    default by more than ``margin`` (a fraction of the default's mean JCT). Where orderings
    nearly tie, a per-world pick is noise, and conflicting labels for alike states teach
    the network a blend that is worse than either.

    ``jobs`` (None: each environment's own ``episode_jobs``) sets the length of these
    episodes: orderings only differ once a backlog builds, which a short episode may never
    show - on 300-job episodes every teacher ties within the margin on almost every world.
    """
    rules = []
    for env in envs:
        totals: dict[str, float] = {}
        own_jobs = env.episode_jobs if jobs is not None else None
        if jobs is not None:
            env.episode_jobs = jobs
        for name in nominators:
            rule = f"{FOLLOW}{name}"
            total = 0.0
            for e in range(episodes):
                env.reset(seed=seed + e)
                while True:
                    a = teacher_action(env.codec, env.engine.state, env.action_masks(), rule=rule)
                    _, _, term, trunc, info = env.step(a)
                    if term or trunc:
                        total += float(info.get("report", {}).get("mean_jct_s", math.inf))
                        break
            totals[rule] = total
        if jobs is not None:
            env.episode_jobs = own_jobs
        default = f"{FOLLOW}{nominators[0]}"
        best = min(totals, key=lambda r: totals[r])
        rules.append(best if totals[best] < totals[default] * (1.0 - margin) else default)
    return rules
