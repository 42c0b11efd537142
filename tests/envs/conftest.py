"""Shared fixtures of the environment tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlsched.envs import GpuPoolEnv
from rlsched.scenario import Scenario, load_scenario

SMALL: dict[str, Any] = {
    "name": "small",
    "cluster": "2x8xA100-80GB,1x8xA100-80GB/mig=balanced,spot:0-2x8xA100-80GB,ondemand:0-2x8xA100-80GB",
    "workload": [{"path": "bundled:philly-3day.csv", "max_jobs": 200}],
    "load_factor": 0.9,
}


@pytest.fixture(scope="session")
def small_scenario() -> Scenario:
    """200 real Philly jobs on a small hybrid cluster (one pool of each kind, one MIG)."""
    return load_scenario(SMALL)


@pytest.fixture(scope="session")
def default_scenario() -> Scenario:
    """The bundled default scenario, loaded once."""
    return load_scenario(None)


def masked_action(env: GpuPoolEnv, rng: np.random.Generator) -> int:
    """A uniformly random legal action."""
    legal = np.flatnonzero(env.action_masks())
    return int(legal[rng.integers(len(legal))])
