"""Live side of rlsched: GPU backends (simulated and NVML), and later the scheduler service."""
