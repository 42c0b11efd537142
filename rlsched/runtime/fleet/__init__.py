"""The fleet runtime: the scheduler service driving GPUs and jobs on many machines through Ray.

* :mod:`~rlsched.runtime.fleet.agent` - :class:`NodeAgent`, one per Ray node: the only code that touches
  that node's GPUs (its NVML or simulated backend) and job processes; plain Python, Ray-agnostic.
* :mod:`~rlsched.runtime.fleet.directory` - finding the agents: one detached actor per live Ray node,
  pinned to it, created on first use and found again after a service restart.
* :mod:`~rlsched.runtime.fleet.backend` - :class:`RayBackend`, the :class:`~rlsched.runtime.backend.GpuBackend`
  of ``--backend ray:...``: inventory and MIG/cordon control routed to each node's agent.
* :mod:`~rlsched.runtime.fleet.executor` - :class:`RayExecutor`, the service's
  :class:`~rlsched.runtime.job_executor.JobExecutor` over the agents: remote launches, polls, signals,
  logs copied back, node loss and fencing.
* :mod:`~rlsched.runtime.fleet.lease` - one service per Ray cluster: a lease actor the service holds.

Ray's own resource accounting is not used for GPUs: agents reserve no Ray CPUs or GPUs and jobs run as
plain processes the agent starts, so rlsched's allocations are the only GPU truth on the cluster.
"""
