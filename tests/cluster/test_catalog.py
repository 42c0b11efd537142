"""The GPU catalogue: canonical names, aliases and MIG geometry (PRIOR_ART section 7)."""

from __future__ import annotations

import pytest

from rlsched.cluster.catalog import (
    CATALOG,
    MIG_COMPUTE_SLICES,
    MIG_MEMORY_SLICES,
    gpu_model,
    resolve_model_name,
)
from rlsched.errors import UnknownGpuModelError


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("A100-SXM4-80GB", "A100-80GB"),
        ("A100-PCIE-80GB", "A100-80GB"),
        ("a100-80gb", "A100-80GB"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("a100", "A100-40GB"),
        ("A100", "A100-40GB"),
        ("h100-80gb", "H100-80GB"),
        ("H100", "H100-80GB"),
        ("H100-80GB-MEGA", "H100-80GB"),
        ("H100-SXM5-80GB", "H100-80GB"),
        ("h200", "H200-141GB"),
        ("V100M32", "V100-32GB"),
        ("V100M16", "V100-16GB"),
        ("v100", "V100-16GB"),
        ("P100", "P100-16GB"),
        ("Quadro RTX 6000", "RTX6000"),
        ("GPU-series-1", "GPU-series-1"),
        ("gpu_series_2", "GPU-series-2"),
        ("T4", "T4"),
    ],
)
def test_aliases_resolve_to_canonical_models(spelling: str, canonical: str) -> None:
    assert resolve_model_name(spelling) == canonical
    model = gpu_model(spelling)
    assert model.name == canonical
    assert model is CATALOG[canonical]


def test_every_canonical_name_resolves_to_itself() -> None:
    for name, model in CATALOG.items():
        assert model.name == name
        assert resolve_model_name(name) == name
        assert gpu_model(name) is model


def test_memory_sizes_follow_the_names() -> None:
    for name in ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "V100-32GB", "V100-16GB"):
        assert str(gpu_model(name).memory_gb) in name


@pytest.mark.parametrize("bad", ["A100-80G", "H100-8GB", "Z9000"])
def test_unknown_model_is_an_error(bad: str) -> None:
    assert resolve_model_name(bad) is None
    with pytest.raises(UnknownGpuModelError, match=repr(bad)):
        gpu_model(bad)


def test_unknown_model_error_suggests_close_names() -> None:
    with pytest.raises(UnknownGpuModelError, match=r"did you mean .*A100-80GB"):
        gpu_model("A100-80G")
    with pytest.raises(UnknownGpuModelError, match=r"did you mean .*H100-80GB"):
        gpu_model("H100-8GB")


def test_unknown_model_without_close_match_lists_known_models() -> None:
    with pytest.raises(UnknownGpuModelError) as info:
        gpu_model("qqqqqqqqqqqqqqqq")
    msg = str(info.value)
    assert "did you mean" not in msg
    assert "A100-80GB" in msg and "H200-141GB" in msg


# Max instances per GPU from mig-parted's config-default.yaml (PRIOR_ART.md section 7).
_MAX_40 = {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}
_MAX_80 = {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
_MAX_141 = {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1,
            "7g.141gb": 1}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("A100-40GB", _MAX_40),
        ("A100-80GB", _MAX_80),
        ("A800-80GB", _MAX_80),
        ("H100-80GB", _MAX_80),
        ("H800-80GB", _MAX_80),
        ("H200-141GB", _MAX_141),
    ],
)
def test_mig_profiles_and_maxima_match_mig_parted(model: str, expected: dict[str, int]) -> None:
    m = gpu_model(model)
    assert m.mig_capable
    assert {p.name: p.max_count for p in m.mig_profiles} == expected
    for p in m.mig_profiles:
        assert m.profile(p.name) is p
        # The name encodes compute slices and memory.
        g, mem = p.name.split("+")[0].split(".")
        assert int(g.rstrip("g")) == p.compute_slices
        assert int(mem.rstrip("gb")) == p.memory_gb
        assert 0 < p.fraction <= 1
        assert p.fraction == pytest.approx(p.compute_slices / MIG_COMPUTE_SLICES)
        # Every legal start keeps the instance inside the 8 memory slices.
        assert p.starts
        for s in p.starts:
            assert s >= 0 and s + p.memory_slices <= MIG_MEMORY_SLICES
        # Memory share: memory slices out of 8 of the GPU's memory (rounded in the names).
        assert abs(p.memory_gb - m.memory_gb * p.memory_slices / MIG_MEMORY_SLICES) <= 1.0


@pytest.mark.parametrize("model", ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"])
def test_mig_placements_follow_nvidia_geometry(model: str) -> None:
    by_shape = {(p.compute_slices, p.memory_slices): p for p in gpu_model(model).mig_profiles if "+me" not in p.name}
    assert by_shape[(1, 1)].starts == (0, 1, 2, 3, 4, 5, 6)
    assert by_shape[(1, 2)].starts == (0, 2, 4, 6)
    assert by_shape[(2, 2)].starts == (0, 2, 4)
    assert by_shape[(3, 4)].starts == (0, 4)
    assert by_shape[(4, 4)].starts == (0,)
    assert by_shape[(7, 8)].starts == (0,)


@pytest.mark.parametrize("model", ["V100-16GB", "V100-32GB", "T4", "K80", "G2"])
def test_non_mig_models_have_no_profiles(model: str) -> None:
    m = gpu_model(model)
    assert not m.mig_capable
    with pytest.raises(UnknownGpuModelError, match="none"):
        m.profile("1g.10gb")


def test_profile_lookup_names_legal_profiles() -> None:
    with pytest.raises(UnknownGpuModelError, match=r"1g\.10gb"):
        gpu_model("H100-80GB").profile("1g.5gb")


@pytest.mark.parametrize(
    ("nvml_name", "canonical"),
    [("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA H100 80GB HBM3", "H100-80GB")],
)
def test_nvml_device_names_resolve(nvml_name: str, canonical: str) -> None:
    assert resolve_model_name(nvml_name) == canonical
