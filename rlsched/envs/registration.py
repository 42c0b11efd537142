"""Registration of rlsched's environments with Gymnasium.

Gymnasium 1.x no longer loads third-party environments from the
``gymnasium.envs`` entry-point group (``load_plugin_envs`` was removed in 1.0), so
registration happens when :mod:`rlsched.envs` is imported. Both of these work::

    import rlsched.envs
    gymnasium.make("rlsched/GpuPool-v0")

    gymnasium.make("rlsched.envs:rlsched/GpuPool-v0")  # imports the module first

The entry point is a string so that registering does not import the simulator.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

ENV_ID = "rlsched/GpuPool-v0"
ENTRY_POINT = "rlsched.envs.gpu_pool:GpuPoolEnv"


def register_envs() -> None:
    """Register ``rlsched/GpuPool-v0`` (idempotent: a second call changes nothing)."""
    if ENV_ID in registry:
        return
    register(id=ENV_ID, entry_point=ENTRY_POINT, disable_env_checker=False)
