"""The compact ``--cluster`` syntax: parsing, formatting, and errors that name the bad group."""

from __future__ import annotations

import re

import pytest

from rlsched.cluster.catalog import gpu_model
from rlsched.cluster.feasibility import pack_layout
from rlsched.cluster.model import PoolKind, Sharing
from rlsched.cluster.shorthand import format_cluster, parse_cluster
from rlsched.errors import ClusterSpecError, RlschedError
from rlsched.runtime.sim_backend import build_fleet


def test_onprem_pool() -> None:
    (p,) = parse_cluster("12x8xA100-80GB")
    assert p.kind is PoolKind.ONPREM
    assert p.model is gpu_model("A100-80GB")
    assert (p.min_nodes, p.max_nodes, p.gpus_per_node) == (12, 12, 8)
    assert p.start_nodes == 12
    assert p.sharing is Sharing.EXCLUSIVE and p.replicas == 1 and p.mig_layout == ()
    assert p.cost_per_gpu_hour is None


def test_spot_pool_with_bounds() -> None:
    (p,) = parse_cluster("spot:0-32x8xH100-80GB")
    assert p.kind is PoolKind.SPOT and p.kind.elastic
    assert (p.min_nodes, p.max_nodes, p.gpus_per_node) == (0, 32, 8)
    assert p.start_nodes == 0
    assert p.model.name == "H100-80GB"


def test_ondemand_pool_with_minimum() -> None:
    (p,) = parse_cluster("ondemand:4-16x8xH100-80GB")
    assert p.kind is PoolKind.ONDEMAND
    assert (p.min_nodes, p.max_nodes, p.start_nodes) == (4, 16, 4)


def test_elastic_bare_number_means_zero_to_n() -> None:
    (p,) = parse_cluster("spot:3x4xA100-40GB")
    assert (p.min_nodes, p.max_nodes) == (0, 3)


def test_mig_balanced_and_plain_mig() -> None:
    (p,) = parse_cluster("2x8xA100-80GB/mig=balanced")
    assert p.sharing is Sharing.MIG
    assert sorted(p.mig_layout) == sorted(["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
    assert pack_layout(p.model, p.mig_layout) is not None
    (q,) = parse_cluster("2x8xA100-80GB/mig")
    assert q.mig_layout == p.mig_layout
    (r,) = parse_cluster("1x8xH100-80GB/mig=3g.40gb+3g.40gb")
    assert r.mig_layout == ("3g.40gb", "3g.40gb")


def test_time_slicing_cost_and_host_options() -> None:
    (p,) = parse_cluster("ondemand:0-4x8xA100-80GB/ts=4/cost=2.5/cpus=96/mem=512/delay=30/idle=120/region=us-east1")
    assert p.sharing is Sharing.TIMESLICE and p.replicas == 4
    assert p.cost_per_gpu_hour == 2.5
    assert p.cpus_per_node == 96.0
    assert p.mem_mib_per_node == 512 * 1024
    assert p.provision_delay_s == 30.0
    assert p.idle_stop_s == 120.0
    assert p.region == "us-east1"


def test_several_groups_get_unique_names() -> None:
    pools = parse_cluster("2x8xA100-80GB, 1x8xA100-80GB/mig=balanced ,spot:0-2x8xA100-80GB,ondemand:0-2x8xA100-80GB")
    assert [p.kind for p in pools] == [PoolKind.ONPREM, PoolKind.ONPREM, PoolKind.SPOT, PoolKind.ONDEMAND]
    names = [p.name for p in pools]
    assert len(set(names)) == 4
    assert names[0] != names[1]


def test_aliases_in_model_position() -> None:
    (p,) = parse_cluster("2x8xA100-SXM4-80GB")
    assert p.model.name == "A100-80GB"


@pytest.mark.parametrize(
    "spec",
    [
        "12x8xA100-80GB",
        "spot:0-32x8xH100-80GB",
        "ondemand:4-16x8xH100-80GB",
        "2x8xA100-80GB/mig=balanced,ondemand:0-4x8xH100-80GB",
        "1x8xH200-141GB/mig=all-1g,2x4xA100-40GB/mig=mixed-4-3,spot:1-3x8xA100-80GB/ts=3",
        "1x8xA100-80GB/mig=all-2g,1x8xA100-80GB/mig=all-7g,1x8xA100-80GB/mig=3g.40gb+3g.40gb",
    ],
)
def test_round_trip_with_format_cluster(spec: str) -> None:
    pools = parse_cluster(spec)
    text = format_cluster(pools)
    again = parse_cluster(text)
    assert again == pools
    assert format_cluster(again) == text


@pytest.mark.parametrize(
    ("spec", "bad_group", "why"),
    [
        ("4x8xB300-288GB", "4x8xB300-288GB", "unknown GPU model"),
        ("2x8xA100-80GB,4x8xA100-80G", "4x8xA100-80G", "did you mean"),
        ("reserved:4x8xA100-80GB", "reserved:4x8xA100-80GB", "unknown pool kind"),
        ("spot:5-2x8xA100-80GB", "spot:5-2x8xA100-80GB", "exceeds maximum"),
        ("2-4x8xA100-80GB", "2-4x8xA100-80GB", "fixed size"),
        ("hello", "hello", "does not parse"),
        ("4x8", "4x8", "does not parse"),
        ("1x8xA100-80GB,4xx8xA100-80GB", "4xx8xA100-80GB", "does not parse"),
        ("0x8xA100-80GB", "0x8xA100-80GB", "at least one node"),
        ("2x0xA100-80GB", "2x0xA100-80GB", "out of range"),
        ("2x17xA100-80GB", "2x17xA100-80GB", "out of range"),
        ("2x8xA100-80GB/mig=4g.40gb+4g.40gb", "2x8xA100-80GB/mig=4g.40gb+4g.40gb", "does not fit"),
        ("2x8xA100-80GB/mig=1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb",
         "2x8xA100-80GB/mig=1g.10gb", "does not fit"),
        ("2x8xA100-80GB/mig=5g.50gb", "2x8xA100-80GB/mig=5g.50gb", "does not exist"),
        ("2x8xA100-80GB/mig=bogus", "2x8xA100-80GB/mig=bogus", "does not exist"),
        ("2x8xV100-32GB/mig", "2x8xV100-32GB/mig", "does not support MIG"),
        ("2x8xA100-80GB/ts=0", "2x8xA100-80GB/ts=0", ">= 1"),
        ("2x8xA100-80GB/ts=x", "2x8xA100-80GB/ts=x", "needs a number"),
        ("2x8xA100-80GB/cost=cheap", "2x8xA100-80GB/cost=cheap", "needs a number"),
        ("2x8xA100-80GB/turbo", "2x8xA100-80GB/turbo", "unknown option"),
    ],
)
def test_bad_groups_name_the_group(spec: str, bad_group: str, why: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster(spec)
    msg = str(info.value)
    assert bad_group in msg
    assert why in msg
    groups = [g.strip() for g in spec.split(",")]
    pos = next(i for i, g in enumerate(groups, 1) if g.startswith(bad_group))
    assert f"group {pos} " in msg


@pytest.mark.parametrize("spec", ["", "   ", ",", " , ,"])
def test_empty_spec(spec: str) -> None:
    with pytest.raises(ClusterSpecError, match="empty"):
        parse_cluster(spec)


@pytest.mark.parametrize(("text", "meant"), [("balancd", "balanced"), ("all1g", "all-1g"), ("mixed-43", "mixed-4-3"),
                                             ("all-7", "all-7g")])
def test_misspelt_mig_layout_gets_a_did_you_mean(text: str, meant: str) -> None:
    """Issue 22 item 10: a named layout typo used to list only the MIG profiles."""
    with pytest.raises(ClusterSpecError, match=f"Did you mean '{re.escape(meant)}'") as info:
        parse_cluster(f"2x8xA100-80GB/mig={text}")
    assert "balanced" in str(info.value) and "cluster spec group 1" in str(info.value)
    with pytest.raises(RlschedError, match=f"Did you mean '{re.escape(meant)}'"):
        build_fleet("1x8xH100-80GB", mig=text)
