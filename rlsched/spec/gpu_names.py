"""Resolve the GPU model names users write (NVML marketing names included).

Pools name their GPUs the way ``nvidia-smi`` prints them (``NVIDIA H100 80GB HBM3``,
``NVIDIA A100-SXM4-80GB``, ``NVIDIA H200``), but the catalogue keys models
canonically (``H100-80GB``). Rather than grow the catalogue's alias table with every
form factor and memory technology, this module peels those words off and asks
:func:`rlsched.cluster.catalog.resolve_model_name` again.
"""

from __future__ import annotations

import difflib
import re

from rlsched.cluster.catalog import CATALOG, resolve_model_name

_VENDOR = re.compile(r"^\s*(nvidia|tesla|geforce|quadro)\b[\s-]*", re.I)
_NOISE = re.compile(r"\b(sxm\d?|pcie|hbm\d?e?|nvl|nvlink|mega|gddr\d?x?)\b", re.I)


def resolve_gpu_name(name: str) -> str | None:
    """Canonical catalogue name for any spelling (``NVIDIA H100 80GB HBM3`` -> ``H100-80GB``), or None."""
    candidates = [name]
    stripped = name
    for _ in range(2):  # "NVIDIA Tesla V100..." has two vendor words
        stripped = _VENDOR.sub("", stripped)
    candidates.append(stripped)
    candidates.append(_NOISE.sub(" ", stripped.replace("-", " ")))
    for c in candidates:
        canonical = resolve_model_name(c.strip())
        if canonical is not None:
            return canonical
    return None


def suggest(name: str) -> list[str]:
    """Close catalogue names for an unknown model (for "did you mean")."""
    return difflib.get_close_matches(name.upper(), list(CATALOG), n=2, cutoff=0.4)
