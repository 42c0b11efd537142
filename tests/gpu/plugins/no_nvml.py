"""pytest plugin (``-p no_nvml``): pynvml behaves as on a machine without the NVIDIA driver."""

from __future__ import annotations

import pynvml


def _no_library() -> None:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


pynvml.nvmlInit = _no_library
