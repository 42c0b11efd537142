"""Choose a GPU backend from a string: ``sim:PATH.json``, ``nvml`` or ``ray:auto`` / ``ray:HOST:PORT``.

Commands take ``--backend``; when it is omitted the environment variable
``RLSCHED_BACKEND`` decides, so that CI and a laptop can point every command at a
simulated fleet once. Nothing here imports NVML or Ray unless ``nvml`` or ``ray:`` is chosen.
"""

from __future__ import annotations

import os

from rlsched.runtime.backend import BackendError, GpuBackend

#: Environment variable holding the default backend specification.
BACKEND_ENV = "RLSCHED_BACKEND"

_FORMS = ("'sim:PATH.json' (a simulated fleet file; create one with 'rlsched inventory init'), 'nvml' (this machine) "
          "or 'ray:auto' / 'ray:HOST:PORT' (every node of a Ray cluster)")


def get_backend(spec: str | None = None) -> GpuBackend:
    """Build the backend named by ``spec`` (or by ``$RLSCHED_BACKEND`` when None).

    Args:
        spec: ``sim:PATH`` for :class:`~rlsched.runtime.sim_backend.SimulatedBackend`,
            ``nvml`` for :class:`~rlsched.runtime.nvml_backend.NvmlBackend`, ``ray:auto`` or
            ``ray:HOST:PORT`` for :class:`~rlsched.runtime.fleet.backend.RayBackend`.

    Raises:
        BackendError: no backend given, an unknown form, a missing fleet file, NVML not
            available, or a Ray address that is malformed or unreachable.
    """
    source = "--backend"
    if spec is None or not spec.strip():
        spec = os.environ.get(BACKEND_ENV, "")
        source = BACKEND_ENV
        if not spec.strip():
            raise BackendError(f"no GPU backend chosen: pass --backend or set {BACKEND_ENV} to {_FORMS}")
    spec = spec.strip()
    if spec.startswith("sim:"):
        path = spec[4:]
        if not path:
            raise BackendError(f"{source} {spec!r}: 'sim:' needs a fleet file path, e.g. sim:fleet.json")
        from rlsched.runtime.sim_backend import SimulatedBackend

        return SimulatedBackend(path)
    if spec == "nvml":
        from rlsched.runtime.nvml_backend import NvmlBackend

        return NvmlBackend()
    if spec.startswith("ray:"):
        from rlsched.ray_connect import RayConnectError, parse_address
        from rlsched.runtime.fleet.backend import RayBackend

        try:
            return RayBackend(str(parse_address(spec[4:], f"{source} ray:")))
        except RayConnectError as exc:
            raise BackendError(str(exc)) from None
    hint = " (did you mean 'sim:" + spec + "'?)" if spec.endswith(".json") else ""
    raise BackendError(f"{source}: unknown backend {spec!r}{hint}; expected {_FORMS}")
