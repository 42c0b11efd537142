"""Counterfactual labels for the heuristic selector: which candidate would have done best from here?

PPO on the selector's environment has to find, from the return of whole episodes, the
hours in which one heuristic beats another; most hours the candidates tie, and the few
that decide a window are lost in the noise of the rest, so PPO settles on the candidate
that is best on average and stays there. Here each candidate is *asked* instead: at a
sampled decision point the environment is deep-copied once per candidate, each copy is
scheduled by its candidate for ``horizon_s`` of simulated time, and the cost of each is
recorded - the job-seconds spent in the system over the horizon plus the work still
owed at its end (every job still queued or running is charged its estimated remaining
run time, so deferring long jobs past the horizon is not free). All copies start from
the same state, random generator included, so they face the same arrivals (common
random numbers). The costs, not only their argmin, are kept: the warm start
(:func:`clone_labels`) imitates a softmax of them, so near-ties teach nothing and a
decisive state teaches its winner.

States come from the labelled policy's own trajectory (it follows each label's winner
until the next label), over episodes of random training worlds; decision points with
fewer than two queued jobs are skipped (every candidate does the same there).
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlsched.cluster.model import ClusterState
from rlsched.envs.selector_env import SelectorEnv
from rlsched.scenario import Scenario
from rlsched.train.config import SelectorParams
from rlsched.train.lookahead import static_memo


@dataclass
class SelectorLabels:
    """Labelled states: regime features and each candidate's rollout cost (job-seconds)."""

    obs: np.ndarray
    costs: np.ndarray
    wins: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0

    def __add__(self, other: SelectorLabels) -> SelectorLabels:
        return SelectorLabels(np.concatenate([self.obs, other.obs]), np.concatenate([self.costs, other.costs]),
                              self.wins + other.wins, self.wall_s + other.wall_s)

    def safest(self) -> int:
        """The candidate whose worst regret over the labelled states is least (ties: least mean regret).

        Regret is a candidate's cost over the state's best. This is the candidate a selector should
        fall back on when its network is unsure: wrong choices are not equally dear, and the one whose
        worst state is mildest costs least when the network's doubt is misplaced (BENCHMARKS.md, "A
        safe default for unsure choices").
        """
        regret = self.costs / np.maximum(self.costs.min(axis=1, keepdims=True), 1e-9)
        order = sorted(range(regret.shape[1]), key=lambda k: (float(regret[:, k].max()), float(regret[:, k].mean()), k))
        return order[0]

    def targets(self, temperature: float) -> np.ndarray:
        """Soft targets: ``softmax(-(cost - min) / (temperature x min))`` per state (ties share the mass)."""
        best = self.costs.min(axis=1, keepdims=True)
        z = -(self.costs - best) / np.maximum(temperature * np.abs(best), 1e-9)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        return np.asarray(p / p.sum(axis=1, keepdims=True))


def owed_work(state: ClusterState) -> float:
    """Seconds of estimated run time still owed to every queued or running job (the horizon's terminal charge)."""
    est = state.estimator
    owed = sum(est.estimate(run.job) for run in state.queue.values())
    owed += sum(max(est.estimate(run.job) - run.work_done, 0.0) for run in state.running.values())
    return float(owed)


def rollout_cost(env: SelectorEnv, action: int, horizon_s: float) -> float:
    """Job-seconds of candidate ``action`` scheduling a copy of ``env`` for ``horizon_s``, plus the work owed."""
    sim = copy.deepcopy(env, static_memo(env))
    start = sim.engine.now
    cost = 0.0
    while True:
        _, _, terminated, truncated, info = sim.step(action)
        cost += float(info["job_seconds"])
        if terminated or truncated or sim.engine.now - start >= horizon_s:
            return cost + owed_work(sim.engine.state)


def collect_labels(scenarios: Sequence[Scenario], params: SelectorParams, seed: int,
                   log: Callable[[str], None] = print,
                   follow: Callable[[np.ndarray], int] | None = None) -> SelectorLabels:
    """``params.label_count`` labelled states along the labelled policy's trajectories (a label every
    ``params.label_every`` choices, each candidate rolled ``params.label_horizon_s`` ahead).

    ``follow`` (observation -> candidate) makes the trajectories a given policy's instead of the label
    winners' (DAgger: the states a cloned policy reaches by its own choices)."""
    candidates, count, every = params.candidates, params.label_count, params.label_every
    horizon_s = params.label_horizon_s
    env = SelectorEnv(scenarios, candidates, hold_s=params.hold_s, episode_jobs=params.episode_jobs)
    obs, _ = env.reset(seed=seed)
    rows: list[np.ndarray] = []
    costs: list[list[float]] = []
    wins: Counter[str] = Counter()
    current, step = 0, 0
    t0 = time.perf_counter()
    while len(rows) < count:
        if step % every == 0 and len(env.engine.state.queue) >= 2:
            c = [rollout_cost(env, k, horizon_s) for k in range(len(candidates))]
            rows.append(obs.copy())
            costs.append(c)
            current = int(np.argmin(c))
            wins[candidates[current]] += 1
            if len(rows) % 250 == 0:
                log(f"  {len(rows):,}/{count:,} labelled states ({time.perf_counter() - t0:.0f} s)")
        if follow is not None:
            current = follow(obs)
        obs, _, terminated, truncated, _ = env.step(current)
        step += 1
        if terminated or truncated:
            obs, _ = env.reset()
            current, step = 0, 0
    return SelectorLabels(np.asarray(rows, dtype=np.float32), np.asarray(costs, dtype=np.float64), wins,
                          time.perf_counter() - t0)


def clone_labels(policy: Any, labels: SelectorLabels, params: SelectorParams, *, seed: int = 0,
                 batch_size: int = 256, lr: float = 1e-3) -> dict[str, float]:
    """Fit the SB3 policy's action distribution to the labels' soft targets (cross-entropy, temperature
    ``params.label_temperature``, ``params.label_epochs`` epochs); statistics.

    ``agreement`` is the share of states whose greedy choice is among the candidates within the
    temperature of the best (a choice that ties the best is right).
    """
    import torch

    temperature, epochs = params.label_temperature, params.label_epochs
    targets = torch.as_tensor(labels.targets(temperature), dtype=torch.float32)
    obs = torch.as_tensor(labels.obs)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)

    def agreement() -> float:
        with torch.no_grad():
            pick = policy.get_distribution(obs).distribution.logits.argmax(dim=1)
        good = labels.costs <= labels.costs.min(axis=1, keepdims=True) * (1 + temperature)
        return float(good[np.arange(len(good)), pick.numpy()].mean())

    before = agreement()
    n = len(obs)
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=gen).split(batch_size):
            logp = policy.get_distribution(obs[idx]).distribution.logits
            loss = -(targets[idx] * logp).sum(dim=1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"selector/labels": float(n), "selector/agreement_before": before, "selector/agreement_after": agreement(),
            "selector/label_wall_s": labels.wall_s}
