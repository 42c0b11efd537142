"""``SelectorEnv``: choose which heuristic schedules the next stretch of simulated time.

The per-slot environment (:class:`~rlsched.envs.gpu_pool.GpuPoolEnv`) asks a network to
pick jobs, and every attempt to clone the best heuristic with it lost that heuristic
somewhere it was not trained (BENCHMARKS.md, "Generalisation across workload families"):
the network has to rediscover each heuristic's ordering from a window of slots, and
outside its training it stops doing so. Here the action *is* a heuristic: at a decision
point the agent chooses one of ``candidates`` (``sjf``, ``fair-share``, ...) and that
heuristic, unchanged, schedules every decision point of the next ``hold_s`` simulated
seconds. Every heuristic is one action away by construction, a policy can never do
something no heuristic does, and what it learns is *when* each one is right - from
:mod:`~rlsched.envs.regime` features that keep their range on any fleet size.

The shell is thin, as the per-slot one: the :class:`~rlsched.sim.engine.Engine` simulates,
the heuristics decide, this class only keeps the episode (a random run of
``episode_jobs`` consecutive jobs of a random scenario), the option's clock and the reward.

## Reward

Minus the integral of the number of jobs in the system (queued or running) over the
option, divided by ``hold_s`` and the fleet's GPUs: summed over an episode this is minus
the total job completion time (Little's law), so maximising it minimises mean JCT - the
quantity every comparison in the project is judged on - without a hand-tuned mix.

## Spaces

Observation: ``Box(0, CLIP, (len(REGIME_FEATURES),))``. Action: ``Discrete(len(candidates))``;
:meth:`action_masks` (for ``sb3_contrib.MaskablePPO``) allows every candidate, since
each can schedule any fleet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from rlsched.envs.gpu_pool import episode_slice
from rlsched.envs.regime import CLIP, REGIME_FEATURES, regime_features
from rlsched.policies import make_policy
from rlsched.scenario import Scenario
from rlsched.sim.engine import Engine

#: default simulated seconds one choice of heuristic holds
DEFAULT_HOLD_S = 3600.0


def in_system(engine: Engine) -> int:
    """Jobs queued or running now (the integrand of total JCT)."""
    return len(engine.state.queue) + len(engine.state.running)


class SelectorEnv(gym.Env[np.ndarray, np.int64]):
    """Pick the heuristic that schedules the next ``hold_s`` seconds of a replayed trace.

    Args:
        scenarios: the training worlds; each episode draws one uniformly.
        candidates: registered heuristic names, one per action.
        hold_s: simulated seconds one choice holds (the option's length).
        episode_jobs: consecutive jobs per episode (None: the whole scenario).
        max_steps: options per episode before truncation (a guard; a heuristic always finishes).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, scenarios: Sequence[Scenario], candidates: Sequence[str], *, hold_s: float = DEFAULT_HOLD_S,
                 episode_jobs: int | None = 1500, max_steps: int = 5000) -> None:
        if not scenarios:
            raise ValueError("SelectorEnv needs at least one scenario")
        if len(candidates) < 2:
            raise ValueError("SelectorEnv needs at least two candidate heuristics to choose between")
        if hold_s <= 0:
            raise ValueError(f"hold_s must be > 0, got {hold_s}")
        for name in candidates:
            make_policy(name)  # unknown names fail here, with the registry's did-you-mean
        self.scenarios = list(scenarios)
        self.candidates = tuple(candidates)
        self.hold_s = float(hold_s)
        self.episode_jobs = episode_jobs
        self.max_steps = max_steps
        self._sorted = [sorted(sc.jobs, key=lambda j: j.submit_time) for sc in self.scenarios]
        self.observation_space = gym.spaces.Box(0.0, CLIP, (len(REGIME_FEATURES),), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(len(self.candidates))
        self._engine: Engine | None = None
        self._schedulers: list[Any] = []
        self._steps = 0
        self._world = 0
        self._last = -1

    @property
    def engine(self) -> Engine:
        """The engine of the current episode (read it, do not drive it)."""
        if self._engine is None:
            raise RuntimeError("call reset() first")
        return self._engine

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """A new episode: a random world, a random run of its jobs, fresh heuristics."""
        super().reset(seed=seed)
        self._world = int(self.np_random.integers(0, len(self.scenarios)))
        sc = self.scenarios[self._world]
        jobs, _ = episode_slice(self._sorted[self._world], self.episode_jobs, self.np_random)
        sim_seed = int(self.np_random.integers(0, 2**31 - 1))
        eng = Engine(sc.pools, jobs, sc.market, replace(sc.sim, seed=sim_seed))
        self._engine = eng
        self._schedulers = [make_policy(name) for name in self.candidates]
        for s in self._schedulers:
            s.reset(eng.state)
        self._steps = 0
        self._last = -1
        eng.advance()
        return regime_features(eng.state), {"world": sc.name}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Let candidate ``action`` schedule until ``hold_s`` has passed (or the episode ends)."""
        eng = self.engine
        k = int(action)
        sched = self._schedulers[k]
        if k != self._last:
            # A heuristic with memory (Tiresias' queues) rebuilds it from the state it takes over: its
            # memory of the hours another candidate scheduled would be stale.
            sched.reset(eng.state)
            self._last = k
        t_end = eng.now + self.hold_s
        area = 0.0
        terminated = False
        while True:
            for decision in sched.decide(eng.state):
                eng.apply(decision)
            t0, n = eng.now, in_system(eng)
            moved = eng.advance()
            area += n * (eng.now - t0)
            if not moved:
                terminated = True
                break
            if eng.now >= t_end:
                break
        self._steps += 1
        gpus = max(eng.state.capacity_gpus(), 1)
        reward = -area / (self.hold_s * gpus)
        truncated = not terminated and self._steps >= self.max_steps
        info = {"world": self.scenarios[self._world].name, "job_seconds": area}
        return regime_features(eng.state), float(reward), terminated, truncated, info

    def static_inputs(self) -> list[Any]:
        """What no step changes (scenarios, their markets, sorted job lists, the episode's immutable jobs):
        a copy of the environment for a counterfactual rollout shares these instead of copying them."""
        out: list[Any] = [*self.scenarios, *self._sorted, *(sc.market for sc in self.scenarios)]
        if self._engine is not None:
            out.append(self._engine.jobs)
            out.extend(self._engine.jobs)
        return out

    def action_masks(self) -> np.ndarray:
        """Every candidate is legal at every decision point."""
        return np.ones(len(self.candidates), dtype=bool)
