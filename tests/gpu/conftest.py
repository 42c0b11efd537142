"""The real-GPU checks: every test here needs NVML and skips (never fails) without it.

``nvml`` opens :class:`~rlsched.runtime.nvml_backend.NvmlBackend` on this machine and
skips the test with "no NVIDIA GPU/driver (...)" where the library, the driver or a
GPU is missing, so ``pytest -m gpu tests/gpu`` is safe to run anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlsched.runtime.backend import BackendError
from rlsched.runtime.nvml_backend import NvmlBackend


@pytest.fixture
def nvml() -> Iterator[NvmlBackend]:
    try:
        be = NvmlBackend()
    except BackendError as exc:
        pytest.skip(f"no NVIDIA GPU/driver ({exc})")
    with be:
        if not be.inventory()[0].gpus:
            pytest.skip("no NVIDIA GPU/driver (NVML reports no GPU)")
        yield be
