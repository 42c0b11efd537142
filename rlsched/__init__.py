"""rlsched: an adaptive GPU-pool scheduler - simulate, learn, plan and serve."""

__version__ = "0.1.0"
