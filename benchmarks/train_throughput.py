"""End-to-end MaskablePPO training throughput: the real environment vs a trivial one.

The trivial environment has exactly the same observation and action spaces (so the
same policy network and the same PPO update cost) but its step is free: it returns
a zero observation, a random mask and ends episodes every 500 steps. If the real
environment trains at a comparable rate, the simulator is not the bottleneck
(issue target: at least half of the trivial rate).

    python benchmarks/train_throughput.py --steps 20480 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np


class TrivialEnv(gym.Env[dict[str, Any], np.int64]):
    """Same spaces as GpuPoolEnv, no simulation behind them."""

    def __init__(self) -> None:
        from rlsched.envs.codec import ObservationCodec

        codec = ObservationCodec()
        self.observation_space = codec.observation_space
        self.action_space = codec.action_space
        self._obs = {k: np.zeros(s.shape, dtype=np.float32) for k, s in codec.observation_space.spaces.items()}
        self._mask = np.ones(codec.n_actions, dtype=bool)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action: Any) -> Any:
        self._t += 1
        return self._obs, 0.0, self._t >= 500, False, {}

    def action_masks(self) -> np.ndarray:
        return self._mask


def rate(kind: str, steps: int, n_envs: int) -> float:
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from rlsched.learned.ppo_net import SlotScoringPolicy

    if kind == "trivial":
        fns = [TrivialEnv for _ in range(n_envs)]
    else:
        from rlsched.envs.gpu_pool import GpuPoolEnv

        fns = [lambda: GpuPoolEnv(episode_jobs=300) for _ in range(n_envs)]
    venv = SubprocVecEnv(fns) if n_envs > 1 else DummyVecEnv(fns)
    model = MaskablePPO(SlotScoringPolicy, venv, n_steps=1024, batch_size=256, n_epochs=4, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(steps)
    dt = time.perf_counter() - t0
    venv.close()
    return steps / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20480)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--n-envs", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    res = {k: statistics.median(rate(k, args.steps, args.n_envs) for _ in range(args.repeat))
           for k in ("trivial", "gpupool")}
    print(f"| env | MaskablePPO steps/s (median of {args.repeat}, {args.n_envs} envs) |")
    print("|---|---:|")
    for k, v in res.items():
        print(f"| {k} | {v:,.0f} |")
    print(f"\nratio gpupool/trivial: {res['gpupool'] / res['trivial']:.2f}")


if __name__ == "__main__":
    main()
