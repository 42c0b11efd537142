"""The discrete-event simulator of GPU pools, MIG slices and spot markets."""

from rlsched.sim.engine import Engine, SimConfig
from rlsched.sim.metrics import RESULT_KEYS, Report, Timeline

__all__ = ["RESULT_KEYS", "Engine", "Report", "SimConfig", "Timeline"]
