"""The Philly, openb and DLRM readers on verbatim slices of the real traces."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rlsched.cluster.job import JobKind
from rlsched.cluster.model import PoolKind
from rlsched.errors import TraceError
from rlsched.workload import (
    detect_format,
    load_trace,
    philly_virtual_clusters,
    read_dlrm_services,
    read_openb_nodes,
    read_openb_pods,
    read_philly,
)
from rlsched.workload.dlrm import MIG_1G_MILLI


def _raw(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


# --- Philly -----------------------------------------------------------------------


def test_philly_whole_trace(data_dir: Path) -> None:
    p = data_dir / "philly_slice.csv"
    raw = _raw(p)
    tr = read_philly(p)
    assert len(tr) == len(raw) and tr.skipped_rows == 0
    assert tr.start == 0.0
    assert sum(j.num_gpus for j in tr.jobs) == sum(int(r["num_gpus"]) for r in raw)
    assert {j.user for j in tr.jobs} == {r["cluster"] for r in raw}
    first = raw[0]  # line 2 of the file
    job = next(j for j in tr.jobs if j.job_id == "philly-2")
    assert job.duration == float(first["duration"]) and job.user == first["cluster"]


def test_philly_per_virtual_cluster(data_dir: Path) -> None:
    p = data_dir / "philly_slice.csv"
    counts = philly_virtual_clusters(p)
    assert list(counts.values()) == sorted(counts.values(), reverse=True)
    assert counts["23dbec"] == 8
    tr = read_philly(p, virtual_cluster="23dbec")
    assert len(tr) == 8 and {j.user for j in tr.jobs} == {"23dbec"}
    assert tr.start == 0.0  # re-based to the VC's own first submission
    ts = sorted(r["timestamp"] for r in _raw(p) if r["cluster"] == "23dbec")
    assert tr.last_submit > 0 and ts[0] < ts[-1]


def test_philly_unknown_vc_lists_known_ones(data_dir: Path) -> None:
    with pytest.raises(TraceError, match=r"no jobs for virtual cluster 'nope'.*6214e9"):
        read_philly(data_dir / "philly_slice.csv", virtual_cluster="nope")


def test_philly_bad_timestamp(tmp_path: Path) -> None:
    p = tmp_path / "ph.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,6,1,6,a\nyesterday,5,1,5,a\n")
    with pytest.raises(TraceError) as info:
        read_philly(p)
    assert (info.value.line, info.value.column) == (3, "timestamp")
    assert len(read_philly(p, skip_bad_rows=True)) == 1


# --- openb ------------------------------------------------------------------------


def test_openb_pods_mapping_and_censoring(data_dir: Path) -> None:
    p = data_dir / "openb_pods_slice.csv"
    raw = {r["name"]: r for r in _raw(p)}
    tr = read_openb_pods(p)
    assert tr.skip_reasons == {"zero duration": 1}
    assert len(tr) + tr.skipped_rows == len(raw)
    running = {n for n, r in raw.items() if r["pod_phase"] == "Running"}
    assert {j.job_id for j in tr.jobs if j.duration_censored} == running
    assert tr.censored == len(running) > 0
    for j in tr.jobs:
        r = raw[j.job_id]
        began = float(r["scheduled_time"] or r["creation_time"])
        assert j.submit_time == float(r["creation_time"])
        assert j.duration == float(r["deletion_time"]) - began > 0
        assert j.cpus == int(r["cpu_milli"]) / 1000 and j.mem_mib == int(r["memory_mib"])
        if r["num_gpu"] == "1":
            assert j.gpu_milli == int(r["gpu_milli"])
        else:
            assert j.gpu_milli == 1000
        assert j.priority == {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}[r["qos"]]
        assert j.preemptible == (r["qos"] == "BE")
    fractional = [j for j in tr.jobs if j.fractional]
    assert fractional and all(0 < j.gpu_demand < 1 for j in fractional)
    assert any(j.num_gpus == 0 for j in tr.jobs)  # CPU-only pods kept for the simulator to count


def test_openb_gpu_spec_resolves_through_catalogue(data_dir: Path) -> None:
    tr = read_openb_pods(data_dir / "openb_pods_slice.csv")
    models = set().union(*(j.gpu_models for j in tr.jobs))
    assert {"V100-16GB", "V100-32GB", "T4", "P100-16GB", "G2"} <= models
    assert all(resolved in {"V100-16GB", "V100-32GB", "T4", "P100-16GB", "G2", "G3", "A10"} for resolved in models)


def test_openb_without_times_is_refused(data_dir: Path) -> None:
    p = data_dir / "openb_multigpu50_slice.csv"
    with pytest.raises(TraceError, match="no timing columns"):
        read_openb_pods(p)
    with pytest.raises(TraceError, match="no timing columns"):
        load_trace(p)


def test_openb_zero_duration_skipped_negative_is_bad(tmp_path: Path) -> None:
    head = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
    )
    p = tmp_path / "pods.csv"
    p.write_text(head + "a,1000,10,1,500,,LS,Succeeded,5,5,\nb,1000,10,1,1000,,BE,Failed,5,9,6\n")
    tr = read_openb_pods(p)
    assert [j.job_id for j in tr.jobs] == ["b"] and tr.skip_reasons == {"zero duration": 1}
    p.write_text(head + "a,1000,10,1,500,,LS,Succeeded,5,4,5\n")
    with pytest.raises(TraceError) as info:
        read_openb_pods(p)
    assert (info.value.line, info.value.column) == (2, "deletion_time")
    p.write_text(head + "a,1000,10,1,500,K9000,LS,Succeeded,5,8,5\n")
    with pytest.raises(TraceError, match="unknown GPU model 'K9000'"):
        read_openb_pods(p)


def test_openb_nodes_become_onprem_pools(data_dir: Path) -> None:
    p = data_dir / "openb_nodes_slice.csv"
    raw = _raw(p)
    pools = read_openb_nodes(p)
    assert len({pl.name for pl in pools}) == len(pools)
    assert all(pl.kind is PoolKind.ONPREM and pl.min_nodes == pl.max_nodes for pl in pools)
    gpu_nodes = [r for r in raw if int(r["gpu"]) > 0]
    assert sum(pl.min_nodes for pl in pools) == len(gpu_nodes)
    assert sum(pl.min_nodes * pl.gpus_per_node for pl in pools) == sum(int(r["gpu"]) for r in gpu_nodes)
    names = {pl.name for pl in pools}
    assert {"openb-v100-16gb-8g", "openb-g2-8g", "openb-t4-2g"} <= names
    v100 = next(pl for pl in pools if pl.name == "openb-v100-16gb-8g")
    assert v100.model.name == "V100-16GB" and v100.cpus_per_node > 0 and v100.mem_mib_per_node > 0


# --- DLRM -------------------------------------------------------------------------


def test_dlrm_services(data_dir: Path) -> None:
    p = data_dir / "dlrm_slice.csv"
    raw = {r["instance_sn"]: r for r in _raw(p)}
    tr = read_dlrm_services(p)
    cpu_only = sum(1 for r in raw.values() if float(r["gpu_request"]) == 0)
    assert tr.skip_reasons["cpu-only"] == cpu_only
    assert len(tr) + tr.skipped_rows == len(raw)
    window_end = max(float(v) for r in raw.values() for k, v in r.items() if k.endswith("_time") and v)
    assert tr.end == window_end
    for j in tr.jobs:
        r = raw[j.job_id]
        assert j.kind is JobKind.SERVICE and j.duration > 0 and j.user == r["app_name"]
        assert (j.num_gpus, j.gpu_milli) == (1, MIG_1G_MILLI)
        if not r["creation_time"]:
            assert j.submit_time == 0.0 and j.duration_censored
        if not r["deletion_time"]:
            assert j.submit_time + j.duration >= j.submit_time and j.duration_censored
            began = float(r["scheduled_time"] or r["creation_time"] or 0)
            assert j.duration == pytest.approx(window_end - began)
        if r["creation_time"] and r["deletion_time"]:
            assert not j.duration_censored
    assert tr.censored == sum(1 for j in tr.jobs if j.duration_censored) > 0


def test_dlrm_whole_gpus_above_one(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text(
        "instance_sn,app_name,gpu_request,creation_time,scheduled_time,deletion_time\n"
        "i0,a,2,10,12,100\ni1,a,1,,,\ni2,a,0.5,5,5,50\n"
    )
    tr = read_dlrm_services(p)
    by_id = {j.job_id: j for j in tr.jobs}
    assert (by_id["i0"].num_gpus, by_id["i0"].gpu_milli, by_id["i0"].duration) == (2, 1000, 88.0)
    assert by_id["i1"].duration == 100.0 and by_id["i1"].duration_censored
    assert by_id["i2"].gpu_milli == 500


# --- formats ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("philly_slice.csv", "philly"), ("openb_pods_slice.csv", "openb"), ("dlrm_slice.csv", "dlrm")],
)
def test_detect_and_load(data_dir: Path, name: str, fmt: str) -> None:
    p = data_dir / name
    assert detect_format(p) == fmt
    assert len(load_trace(p)) == len(load_trace(p, fmt))


def test_load_trace_errors(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="file not found"):
        load_trace(tmp_path / "missing.csv")
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match=r"supported formats: canonical.*philly.*openb.*dlrm"):
        load_trace(odd)
    with pytest.raises(TraceError, match="node list"):
        detect_format(data_dir / "openb_nodes_slice.csv")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(data_dir / "philly_slice.csv", "parquet")
    with pytest.raises(TraceError, match="philly traces only"):
        load_trace(data_dir / "dlrm_slice.csv", virtual_cluster="x")
