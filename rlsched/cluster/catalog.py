"""The GPU catalogue: models, memory, and MIG geometry as data.

MIG facts follow NVIDIA's MIG user guide and mig-parted's ``config-default.yaml``
(see ``shared/docs/PRIOR_ART.md`` section 7). A MIG-capable GPU has 7 compute
slices and 8 memory slices. A GPU instance occupies a contiguous run of memory
slices starting at one of a profile's legal start positions; placements may not
overlap and the compute slices in use may not exceed 7. Legal layouts are therefore
checked by placement, not by per-profile maxima alone (eight ``1g.10gb`` on an H100
is illegal even though each fits on its own).

Model names are canonical (``H100-80GB``); vendor and trace spellings
(``h100-80gb``, ``A100-SXM4-80GB``, ``V100M32``...) resolve through aliases so that
every reader maps onto the same catalogue.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from rlsched.errors import UnknownGpuModelError

#: Compute and memory slices of every MIG-capable GPU in the catalogue.
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of a MIG-capable model, e.g. ``3g.40gb``.

    Attributes:
        name: profile name as NVML/mig-parted spell it.
        compute_slices: the ``g`` count (1, 2, 3, 4 or 7).
        memory_slices: contiguous memory slices (of 8) the instance occupies.
        memory_gb: framebuffer memory of one instance.
        max_count: most instances of this profile on one GPU.
        starts: legal start positions (memory-slice index) on the GPU.
    """

    name: str
    compute_slices: int
    memory_slices: int
    memory_gb: int
    max_count: int
    starts: tuple[int, ...]

    @property
    def fraction(self) -> float:
        """Share of the GPU's compute this instance gets (g / 7)."""
        return self.compute_slices / MIG_COMPUTE_SLICES


@dataclass(frozen=True, slots=True, eq=False)
class GpuModel:
    """A GPU model: memory, relative speed and (if any) MIG profiles.

    ``speed`` is relative training throughput (V100 = 1.0), a coarse public
    figure used only to scale durations when a trace job runs on a model other than
    the one it was recorded on; it is 1.0 where nothing better is known.
    """

    name: str
    memory_gb: int
    mig_profiles: tuple[MigProfile, ...] = ()
    speed: float = 1.0

    def __hash__(self) -> int:
        # Names are unique in the catalogue; hashing the whole profile table made every
        # cached feasibility lookup (pack_layout, profile_for) pay for it.
        return hash(self.name)

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile:
        """Return the MIG profile called ``name`` or raise with the legal names."""
        for p in self.mig_profiles:
            if p.name == name:
                return p
        legal = ", ".join(p.name for p in self.mig_profiles) or "none (no MIG support)"
        raise UnknownGpuModelError(f"MIG profile {name!r} does not exist on {self.name}; legal: {legal}")


def _mig_geometry(gb1: int, gb1_double: int, gb2: int, gb3: int, gb4: int, gb7: int) -> tuple[MigProfile, ...]:
    """The A100/H100/H200 geometry with the given per-profile memory sizes."""
    return (
        MigProfile(f"1g.{gb1}gb", 1, 1, gb1, 7, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{gb1}gb+me", 1, 1, gb1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{gb1_double}gb", 1, 2, gb1_double, 4, (0, 2, 4, 6)),
        MigProfile(f"2g.{gb2}gb", 2, 2, gb2, 3, (0, 2, 4)),
        MigProfile(f"3g.{gb3}gb", 3, 4, gb3, 2, (0, 4)),
        MigProfile(f"4g.{gb4}gb", 4, 4, gb4, 1, (0,)),
        MigProfile(f"7g.{gb7}gb", 7, 8, gb7, 1, (0,)),
    )


_MIG_40 = _mig_geometry(5, 10, 10, 20, 20, 40)
_MIG_80 = _mig_geometry(10, 20, 20, 40, 40, 80)
_MIG_141 = _mig_geometry(18, 35, 35, 71, 71, 141)

_MODELS: tuple[GpuModel, ...] = (
    GpuModel("A100-40GB", 40, _MIG_40, speed=2.2),
    GpuModel("A100-80GB", 80, _MIG_80, speed=2.4),
    GpuModel("A800-80GB", 80, _MIG_80, speed=2.4),
    GpuModel("H100-80GB", 80, _MIG_80, speed=4.0),
    GpuModel("H800-80GB", 80, _MIG_80, speed=3.8),
    GpuModel("H200-141GB", 141, _MIG_141, speed=4.5),
    GpuModel("V100-16GB", 16, speed=1.0),
    GpuModel("V100-32GB", 32, speed=1.0),
    GpuModel("P100-16GB", 16, speed=0.55),
    GpuModel("K80", 12, speed=0.25),
    GpuModel("T4", 16, speed=0.45),
    GpuModel("A10", 24, speed=0.9),
    GpuModel("L4", 24, speed=0.95),
    GpuModel("RTX6000", 24, speed=0.9),
    # Anonymised models of the Alibaba traces: memory is not published; 24 GB is
    # a conservative guess so that they are never offered as large-memory GPUs.
    GpuModel("G2", 24),
    GpuModel("G3", 24),
    GpuModel("GPU-series-1", 24),
    GpuModel("GPU-series-2", 24),
)

CATALOG: dict[str, GpuModel] = {m.name: m for m in _MODELS}

_ALIASES: dict[str, str] = {
    "a100": "A100-40GB",
    "a10040gb": "A100-40GB",
    "a100sxm440gb": "A100-40GB",
    "a100pcie40gb": "A100-40GB",
    "a10080gb": "A100-80GB",
    "a100sxm480gb": "A100-80GB",
    "a100pcie80gb": "A100-80GB",
    "a800": "A800-80GB",
    "a800sxm480gb": "A800-80GB",
    "a80080gb": "A800-80GB",
    "h100": "H100-80GB",
    "h10080gb": "H100-80GB",
    "h10080gbmega": "H100-80GB",
    "h100sxm580gb": "H100-80GB",
    "h800": "H800-80GB",
    "h80080gb": "H800-80GB",
    "h200": "H200-141GB",
    "h200141gb": "H200-141GB",
    "v100": "V100-16GB",
    "v10016gb": "V100-16GB",
    "v100m16": "V100-16GB",
    "v10032gb": "V100-32GB",
    "v100m32": "V100-32GB",
    "v100sxm216gb": "V100-16GB",
    "v100sxm232gb": "V100-32GB",
    "v100pcie16gb": "V100-16GB",
    "v100pcie32gb": "V100-32GB",
    "h100pcie": "H100-80GB",
    "h100sxm": "H100-80GB",
    "h100pcie80gb": "H100-80GB",
    "a10g": "A10",
    "p100pcie16gb": "P100-16GB",
    "p100sxm216gb": "P100-16GB",
    "h200nvl": "H200-141GB",
    "h200141gbhbm3e": "H200-141GB",
    "p100": "P100-16GB",
    "p10016gb": "P100-16GB",
    "k80": "K80",
    "t4": "T4",
    "a10": "A10",
    "l4": "L4",
    "rtx6000": "RTX6000",
    "quadrortx6000": "RTX6000",
    "g2": "G2",
    "g3": "G3",
    "gpuseries1": "GPU-series-1",
    "gpuseries2": "GPU-series-2",
}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_VENDOR_PREFIXES = ("nvidia", "tesla", "geforce", "quadro")
_MEMORY_SUFFIXES = ("hbm3e", "hbm3", "hbm2e", "hbm2", "gddr6")


def resolve_model_name(name: str) -> str | None:
    """Canonical catalogue name for ``name`` (any spelling), or None if unknown.

    Accepts catalogue names, trace spellings (``V100M32``, ``a100-80gb``) and NVML
    marketing names (``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-80GB``,
    ``Tesla V100-SXM2-16GB``): vendor prefixes and memory-type suffixes are dropped.
    """
    if name in CATALOG:
        return name
    key = _key(name)
    if key in _ALIASES:
        return _ALIASES[key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    for suffix in _MEMORY_SUFFIXES:
        if key.endswith(suffix):
            key = key[: -len(suffix)]
            break
    return _ALIASES.get(key)


def gpu_model(name: str) -> GpuModel:
    """Look up a GPU model by any known spelling.

    Raises:
        UnknownGpuModelError: with the closest catalogue names as a hint.
    """
    canonical = resolve_model_name(name)
    if canonical is None:
        close = difflib.get_close_matches(name, list(CATALOG), n=3, cutoff=0.4)
        hint = f"; did you mean {' or '.join(close)}?" if close else f"; known: {', '.join(CATALOG)}"
        raise UnknownGpuModelError(f"unknown GPU model {name!r}{hint}")
    return CATALOG[canonical]
