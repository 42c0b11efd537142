"""The workload generator: seeded, at the offered load it promises, with the shapes it names."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rlsched.cluster.shorthand import parse_cluster
from rlsched.workload import read_canonical
from rlsched.workload.generator import (
    FAMILIES,
    MIG_SHARES,
    DurationComponent,
    FamilySpec,
    GeneratorError,
    family,
    generate,
    random_family,
    with_overrides,
)
from rlsched.workload.windows import offered_load


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    spec = FAMILIES["bursty"]
    a, b, c = generate(spec, 7), generate(spec, 7), generate(spec, 8)
    assert a.jobs == b.jobs
    assert a.jobs != c.jobs


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_meets_its_load_on_its_own_fleet(name: str) -> None:
    spec = FAMILIES[name]
    trace = generate(spec, 0)
    assert len(trace) == spec.jobs
    pools = parse_cluster(spec.cluster)  # a cluster string the simulator reads
    whole = sum(p.max_nodes * p.gpus_per_node for p in pools if p.sharing.value != "mig")
    assert all(j.num_gpus <= max(whole, 1) for j in trace.jobs)
    if spec.backlog_jobs == 0:  # a backlog at t=0 stretches nothing: only the arrival span carries the load
        assert offered_load(trace, spec.nodes * spec.gpus_per_node) == pytest.approx(spec.load, rel=0.01)


def test_bursts_concentrate_arrivals() -> None:
    calm = with_overrides(FAMILIES["bursty"], burst_factor=1.0, burst_share=0.0)
    def peak_share(spec: FamilySpec) -> float:
        t = np.array([j.submit_time for j in generate(spec, 1).jobs])
        counts, _ = np.histogram(t, bins=100)
        return float(np.sort(counts)[-10:].sum() / counts.sum())  # share of arrivals in the busiest 10%
    assert peak_share(FAMILIES["bursty"]) > 1.8 * peak_share(calm)


def test_fractional_requests_are_mig_sized_and_only_on_one_gpu_jobs() -> None:
    trace = generate(FAMILIES["fractional"], 2)
    frac = [j for j in trace.jobs if j.gpu_milli < 1000]
    assert 0.25 < len(frac) / len(trace) < 0.45
    assert {j.gpu_milli for j in frac} <= set(MIG_SHARES)
    assert all(j.num_gpus == 1 for j in frac)


def test_gangs_are_whole_nodes_and_run_longer() -> None:
    trace = generate(FAMILIES["gang"], 3)
    gangs = [j for j in trace.jobs if j.num_gpus > 8]
    singles = [j for j in trace.jobs if j.num_gpus == 1]
    assert gangs and all(j.num_gpus % 8 == 0 for j in gangs)
    assert np.median([j.duration for j in gangs]) > np.median([j.duration for j in singles])


def test_backlog_jobs_arrive_at_time_zero() -> None:
    spec = FAMILIES["overload"]
    trace = generate(spec, 0)
    assert sum(1 for j in trace.jobs if j.submit_time == 0.0) >= spec.backlog_jobs


def test_users_carry_duration_information_when_asked() -> None:
    def spread(sigma: float) -> float:
        trace = generate(with_overrides(FAMILIES["steady"], user_sigma=sigma, jobs=4000), 5)
        by_user: dict[str, list[float]] = {}
        for j in trace.jobs:
            by_user.setdefault(j.user, []).append(np.log(j.duration))
        means = [np.mean(v) for v in by_user.values() if len(v) > 30]
        return float(np.std(means))
    assert spread(1.5) > 3 * spread(0.0)


@pytest.mark.parametrize(("override", "message"), [
    ({"load": -0.5}, "load must be in (0, 10]"),
    ({"load": float("nan")}, "load must be in (0, 10]"),
    ({"jobs": 0}, "jobs must be >= 1"),
    ({"gpu_mix": ((128, 1.0),)}, "asks for 128 GPUs per job but the fleet has 128"),
    ({"gpu_mix": ((12, 1.0),)}, "a 12-GPU gang is not a whole number of 8-GPU nodes"),
    ({"gpu_mix": ((0, 1.0),)}, "asks for 0 GPUs per job"),
    ({"durations": (DurationComponent(1.0, -5.0, 1.0),)}, "durations[0].median_s must be > 0"),
    ({"fractional": 1.5}, "fractional must be in [0, 1]"),
    ({"backlog_jobs": 5000}, "backlog_jobs must be in 0..jobs"),
    ({"mig_nodes": 16, "mig": "balanced"}, "every node is MIG-split"),
])
def test_impossible_parameters_are_named(override: dict[str, object], message: str) -> None:
    spec = replace(FAMILIES["steady"], **override)  # type: ignore[arg-type]
    if "128" in message:
        spec = replace(spec, nodes=15)  # 120 GPUs
        message = "asks for 128 GPUs per job but the fleet has 120"
    with pytest.raises(GeneratorError, match="family 'steady': ") as exc:
        generate(spec, 0)
    assert message in str(exc.value)


def test_unknown_family_and_parameter_suggest() -> None:
    with pytest.raises(GeneratorError, match="did you mean 'bursty'"):
        family("bursti")
    with pytest.raises(GeneratorError, match="unknown parameter 'lod'"):
        with_overrides(FAMILIES["steady"], lod=1.0)


def test_random_families_are_valid_and_respect_exclusions() -> None:
    rng = np.random.default_rng(0)
    for i in range(60):
        spec = random_family(rng, exclude=("gang", "overload", "tiny-fleet"))
        spec.validate()
        parse_cluster(spec.cluster)
        assert max(g for g, _ in spec.gpu_mix) <= 8
        assert spec.load <= 1.1 and spec.backlog_jobs == 0 and spec.nodes >= 8
        assert len(generate(replace(spec, jobs=50, backlog_jobs=0), i)) == 50
    with pytest.raises(GeneratorError, match="unknown workload family 'gangs'"):
        random_family(rng, exclude=("gangs",))


def test_cli_writes_a_canonical_trace_and_errors_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "g.csv"
    cmd = [sys.executable, "-c", "from rlsched.cli import main; main()", "trace", "generate", "tiny-fleet",
           "-o", str(out), "--seed", "4", "--set", "load=1.2", "--set", "jobs=300"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 300 jobs" in proc.stdout and "--cluster 4x8xA100-80GB" in proc.stdout
    spec = with_overrides(FAMILIES["tiny-fleet"], load=1.2, jobs=300)
    assert read_canonical(out).jobs == generate(spec, 4).jobs
    bad = subprocess.run([*cmd[:5], "tiny-fleet", "-o", str(out), "--set", "nodes=0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "nodes must be in 1..100000" in bad.stderr


def test_random_family_respects_max_nodes_and_refuses_an_empty_range() -> None:
    from rlsched.train.families import trained_generator_families

    sizes = {random_family(np.random.default_rng(s), max_nodes=16).nodes for s in range(60)}
    assert sizes <= {4, 8, 16} and len(sizes) == 3
    with pytest.raises(GeneratorError, match="max_nodes 4 leaves no fleet size"):
        random_family(np.random.default_rng(0), max_nodes=4, exclude=["tiny-fleet"])
    assert "large-fleet" not in trained_generator_families([], max_nodes=16)
    assert "large-fleet" in trained_generator_families([], max_nodes=64)
