"""Training and evaluation worlds cut from an experiment's scenarios.

A *world* is a :class:`~rlsched.scenario.Scenario` restricted to one time window
and one cluster/load variant. Training samples a world per episode (many windows,
cluster sizes and loads, so that no single shape is memorised); evaluation replays
each evaluation window whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np

from rlsched.cluster.shorthand import format_cluster, parse_cluster
from rlsched.market.base import Market
from rlsched.scenario import Scenario, apply_workload_options, load_scenario
from rlsched.train.config import ExperimentError, ScenarioEntry
from rlsched.workload.trace import Trace
from rlsched.workload.windows import take, window


@dataclass(frozen=True)
class World:
    """A scenario window ready to simulate, with a label for reports.

    ``entry`` / ``start_h`` / ``end_h`` / ``load`` say where the window was cut from
    (the scenario entry's name, hours from the trace start, load factor). ``forecaster``
    is a fitted demand forecaster on this world's clock (None: none runs); every replay
    of the world gets a fresh copy of it (see :func:`rlsched.workload.forecast.fresh_forecaster`).
    """

    label: str
    scenario: Scenario
    entry: str = ""
    start_h: float = 0.0
    end_h: float = 0.0
    load: float | None = None
    forecaster: Any = None
    forecast_horizon_s: float = 3600.0


@lru_cache(maxsize=16)
def _load(spec_key: str) -> Scenario:
    import json

    spec: Any = json.loads(spec_key)
    return load_scenario(spec)


def load_entry(entry: ScenarioEntry) -> Scenario:
    """The entry's scenario, loaded once per process."""
    import json

    return _load(json.dumps(entry.scenario, sort_keys=True))


def _variants(entry: ScenarioEntry, base: Scenario) -> list[tuple[str, Scenario, float | None]]:
    """Every (cluster, market period, load) variant of an entry: label, scenario, load factor.

    A cluster override keeps the scenario's own market (prices, availability and
    preemption source), checked against the new pools; a market offset reads the same
    market that many hours later (another price period).
    """
    from rlsched.market import TableMarket

    clusters = entry.clusters or (None,)
    loads = entry.load_factors or (None,)
    offsets = entry.market_offsets_h or (None,)
    table = base.market if isinstance(base.market, TableMarket) else None
    if table is None and (entry.clusters or entry.market_offsets_h):
        raise ExperimentError(f"scenario {entry.name}: clusters/market_offsets_h need a table market")
    out = []
    for c in clusters:
        pools = parse_cluster(c) if c else base.pools
        if c and table is not None:
            table.check_pools(pools)
        for off in offsets:
            market: Market = base.market
            if off is not None and table is not None:
                market = table.with_offset(table.offset_s + off * 3600.0)
            for lf in loads:
                label = f"{format_cluster(pools) if c else 'base'}@{lf if lf is not None else 'trace'}"
                if off is not None:
                    label += f"@market+{off:g}h"
                out.append((label, replace(base, pools=pools, market=market, jobs=base.jobs,
                                           name=f"{base.name}[{label}]", source=f"{base.source}|{lf}"), lf))
    return out


def _cut(sc: Scenario, start_h: float, end_h: float, max_jobs: int | None, load: float | None) -> Scenario:
    jobs = sc.jobs
    if not jobs:
        return sc
    t0 = jobs[0].submit_time
    tr = window(Trace(list(jobs)), t0 + start_h * 3600.0, t0 + end_h * 3600.0)
    if max_jobs is not None:
        tr = take(tr, max_jobs)
    cut = tr.jobs
    if load is not None and len(cut) >= 2:
        cut = apply_workload_options(cut, sc.pools, load_factor=load)
    return replace(sc, jobs=cut)


def training_worlds(entries: tuple[ScenarioEntry, ...]) -> list[World]:
    """Every (scenario, variant) training world, cut to its training window."""
    worlds = []
    for entry in entries:
        base = load_entry(entry)
        assert entry.train_window_h is not None
        a, b = entry.train_window_h
        for label, sc, lf in _variants(entry, base):
            cut = _cut(sc, a, b, None, lf)
            if len(cut.jobs) < 2:
                raise ExperimentError(f"scenario {entry.name}: training window [{a}, {b}] h has {len(cut.jobs)} jobs")
            worlds.append(World(f"{entry.name}/{label}/train", cut, entry.name, a, b, lf))
    return worlds


def evaluation_worlds(entries: tuple[ScenarioEntry, ...], max_jobs: int) -> list[World]:
    """Every (scenario, variant, evaluation window) world."""
    worlds = []
    for entry in entries:
        base = load_entry(entry)
        windows = entry.eval_windows_h
        if not windows:
            span_h = (base.jobs[-1].submit_time - base.jobs[0].submit_time) / 3600.0 if base.jobs else 0.0
            windows = ((0.0, max(span_h, 1.0) + 1.0),)
        for label, sc, lf in _variants(entry, base):
            for a, b in windows:
                cut = _cut(sc, a, b, max_jobs, lf)
                if len(cut.jobs) < 1:
                    raise ExperimentError(f"scenario {entry.name}: evaluation window [{a}, {b}] h has no jobs")
                worlds.append(World(f"{entry.name}/{label}/eval[{a:g}-{b:g}h]", cut, entry.name, a, b, lf))
    return worlds


class MultiWorldEnv(gym.Env[dict[str, Any], np.int64]):
    """Samples one training world per episode; every world shares one codec layout.

    Args:
        worlds: training worlds.
        env_kwargs: passed to each :class:`~rlsched.envs.gpu_pool.GpuPoolEnv`.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, worlds: list[World], **env_kwargs: Any) -> None:
        from rlsched.envs.gpu_pool import GpuPoolEnv

        if not worlds:
            raise ExperimentError("no training worlds")
        self.envs = [GpuPoolEnv(w.scenario, forecaster=w.forecaster, forecast_horizon_s=w.forecast_horizon_s,
                                **env_kwargs) for w in worlds]
        self.labels = [w.label for w in worlds]
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.current = self.envs[0]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        i = int(self.np_random.integers(0, len(self.envs)))
        self.current = self.envs[i]
        obs, info = self.current.reset(seed=int(self.np_random.integers(0, 2**31 - 1)))
        info["world"] = self.labels[i]
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self.current.step(action)

    def action_masks(self) -> np.ndarray:
        return self.current.action_masks()
