"""Per-state teacher labels: at a sampled decision point, roll each follow teacher forward on a copy.

No heuristic is best everywhere, and which one is best is a property of the *moment*
(how deep the backlog is, how much the duration estimates are worth, who floods the
queue), not of the world: a per-world pick (``best-follow``) teaches a world's majority
ordering to every state of it, and the clone learns to recognise worlds instead of
moments. The ``lookahead`` teacher labels states instead. Every ``label_every``
decisions that offer a real choice (more than one legal action), it deep-copies the
training environment, lets each candidate ``follow:NAME`` teacher schedule the copy for
``horizon_s`` of simulated time, and follows the one whose rollout cost least until the
next label. The first candidate is the default: another is followed only where it beats
the default by more than ``margin`` (a fraction of the default's penalty), since a pick
between near-ties is noise and conflicting labels for alike states teach a blend.

The penalty is minus the environment's own reward summed over the rollout, so it weighs
what training optimises (job-hours in the system, cost, deadlines, preemptions). Every
rollout starts from the same copy, random state included, so the candidates face the
same arrivals and the same simulation draws (common random numbers). The horizon must
cover a backlog's life: over a short one shortest-first always looks best, because the
long jobs it defers are charged only after the horizon.

The copy shares what never changes during an episode (the scenario, its sorted job list
and the fitted forecaster template) through the deep-copy memo; copying those would cost
seconds per label on large traces, the rest costs tens of milliseconds.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlsched.train.teacher import FOLLOW, teacher_action


def static_memo(env: Any) -> dict[int, Any]:
    """Deep-copy memo entries that keep an episode's read-only inputs (what ``env.static_inputs()`` names)
    shared with the original; used for every counterfactual copy of a training environment."""
    return {id(x): x for x in env.static_inputs()}


def rollout_penalty(env: Any, rule: str, horizon_s: float, max_steps: int = 100_000) -> float:
    """The penalty (minus the summed reward) of teacher ``rule`` scheduling a copy of ``env`` for ``horizon_s``.

    ``env`` itself is left untouched. The rollout ends at the horizon, when the episode
    ends, or after ``max_steps`` decisions (a guard; auto-advance makes each step move the
    clock or place something, so it is not reached in practice).
    """
    sim = copy.deepcopy(env, static_memo(env))
    start = sim.engine.now
    penalty = 0.0
    for _ in range(max_steps):
        action = teacher_action(sim.codec, sim.engine.state, sim.action_masks(), rule=rule)
        _, reward, terminated, truncated, _ = sim.step(action)
        penalty -= float(reward)
        if terminated or truncated or sim.engine.now - start >= horizon_s:
            break
    return penalty


def pick_by_rollouts(env: Any, candidates: tuple[str, ...], horizon_s: float,
                     margin: float) -> tuple[str, dict[str, float]]:
    """The candidate nominator to follow from ``env``'s current state, and every candidate's penalty.

    The first candidate wins unless another's penalty is below ``(1 - margin)`` times its own.
    """
    penalties = {name: rollout_penalty(env, f"{FOLLOW}{name}", horizon_s) for name in candidates}
    default = candidates[0]
    best = min(candidates, key=lambda n: penalties[n])
    if penalties[best] < penalties[default] * (1.0 - margin):
        return best, penalties
    return default, penalties


@dataclass
class LookaheadTeacher:
    """The ``lookahead`` teacher's state across the environments of a teacher collection.

    :meth:`rule_for` gives the ``follow:NAME`` rule to act with in an environment now,
    relabelling on an episode's first choice and every ``every`` choices after it.
    ``labels`` counts the picks and ``seconds`` the time spent in rollouts, for the log,
    MLflow and the model card; ``log`` (if given) gets :meth:`summary` every ``report_every``
    labels, since labelling is most of a lookahead run's time.
    """

    candidates: tuple[str, ...]
    horizon_s: float = 86_400.0
    margin: float = 0.02
    every: int = 100
    log: Callable[[str], None] | None = None
    report_every: int = 50
    labels: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    _rule: dict[int, str] = field(default_factory=dict)
    _left: dict[int, int] = field(default_factory=dict)
    _engine: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("the lookahead teacher needs at least one candidate nominator")
        if self.every < 1 or self.horizon_s <= 0 or not 0.0 <= self.margin < 1.0:
            raise ValueError(f"lookahead: every >= 1, horizon_s > 0 and 0 <= margin < 1 "
                             f"(got {self.every}, {self.horizon_s}, {self.margin})")

    def rule_for(self, env: Any, mask: np.ndarray) -> str:
        """The rule to act with in ``env`` at this decision (a new label when one is due)."""
        key = id(env)
        if self._engine.get(key) is not env.engine:  # a new episode: label its first choice
            self._engine[key] = env.engine
            self._rule[key] = f"{FOLLOW}{self.candidates[0]}"
            self._left[key] = 0
        if int(mask.sum()) > 1:
            if self._left[key] <= 0:
                t0 = time.perf_counter()
                name, _ = pick_by_rollouts(env, self.candidates, self.horizon_s, self.margin)
                self.seconds += time.perf_counter() - t0
                self.labels[name] += 1
                self._rule[key] = f"{FOLLOW}{name}"
                self._left[key] = self.every
                if self.log is not None and sum(self.labels.values()) % self.report_every == 0:
                    self.log(self.summary())
            self._left[key] -= 1
        return self._rule[key]

    def summary(self) -> str:
        """One log line: the picks per candidate and the time the rollouts took."""
        picks = ", ".join(f"{n} {self.labels[n]}" for n in self.candidates)
        return (f"lookahead labels ({self.horizon_s / 3600:g} h rollouts every {self.every} choices): {picks} "
                f"in {self.seconds:.0f} s")
