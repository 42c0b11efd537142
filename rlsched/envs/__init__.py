"""Gymnasium environments over the rlsched simulator.

Importing this package registers ``rlsched/GpuPool-v0`` so that
``gymnasium.make("rlsched/GpuPool-v0")`` works with no arguments (bundled
default scenario).
"""

from __future__ import annotations

from rlsched.envs.codec import ObservationCodec
from rlsched.envs.gpu_pool import GpuPoolEnv
from rlsched.envs.registration import ENV_ID, register_envs

register_envs()

__all__ = ["ENV_ID", "GpuPoolEnv", "ObservationCodec", "register_envs"]
