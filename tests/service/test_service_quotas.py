"""The quota functions on their own (pure: no store, no clock)."""

from __future__ import annotations

from rlsched.service.quotas import (
    Ask,
    Holding,
    admission_problem,
    blocking,
    never_fits,
    over_quota,
    principal_matches,
    usage,
)
from rlsched.spec.model import QuotaDecl

NOW = 1_000_000.0


def test_principals() -> None:
    assert principal_matches("alice", "alice") and principal_matches("user:alice", "alice")
    assert principal_matches("*", "bob") and not principal_matches("team-a", "alice")


def test_usage_counts_gpus_slices_and_hours_of_the_last_day() -> None:
    q = QuotaDecl("q", "p", "alice", max_gpus=8, max_gpu_hours_per_day=10)
    hs = [
        Holding("alice", "p", 2, None, 2.0, NOW - 3600, None),  # 2 GPU-hours so far
        Holding("alice", "p", 0, "3g.40gb", 3 / 7, NOW - 7 * 3600, None),  # 3 GPU-hours
        Holding("alice", "p", 4, None, 4.0, NOW - 2 * 86_400, NOW - 86_400 + 1800),  # 0.5 h in the window x4
        Holding("bob", "p", 4, None, 4.0, NOW - 3600, None),
        Holding("alice", "other", 4, None, 4.0, NOW - 3600, None),
    ]
    u = usage(q, hs, NOW)
    assert u.gpus == 2 and u.slices == {"3g.40gb": 1}
    assert abs(u.gpu_hours - (2 + 3 + 2)) < 1e-6


def test_never_fits_and_over_quota_messages() -> None:
    q = QuotaDecl("team_a", "onprem", "team-a", max_gpus=8, max_gpu_hours_per_day=24)
    assert never_fits(q, Ask("team-a", "onprem", 16, None, 16.0)) == (
        "quota team_a allows team-a in pool onprem at most 8 GPUs; the job asks for 16")
    assert never_fits(q, Ask("team-a", "onprem", 8, None, 8.0)) is None
    assert "GPU-hours per day" in (never_fits(q, Ask("team-a", "onprem", 4, None, 4.0, 7 * 3600)) or "")
    used = usage(q, [Holding("team-a", "onprem", 7, None, 7.0, NOW - 60, None)], NOW)
    assert over_quota(q, used, Ask("team-a", "onprem", 2, None, 2.0)) == "quota team_a: 7/8 GPUs in use"
    assert over_quota(q, used, Ask("team-a", "onprem", 1, None, 1.0)) is None
    s = QuotaDecl("interns", "mig", "group:interns", max_slices={"1g.10gb": 2})
    one = Holding("group:interns", "mig", 0, "1g.10gb", 1 / 7, NOW - 60, None)
    ask = Ask("group:interns", "mig", 0, "1g.10gb", 1 / 7)
    assert blocking([s], [one], ask, NOW) is None
    assert blocking([s], [one, one], ask, NOW) == "quota interns: 2/2 1g.10gb instances in use"
    assert blocking([s], [one, one], Ask("group:interns", "mig", 0, "3g.40gb", 3 / 7), NOW) is None  # not listed


def test_admission_only_refuses_when_every_pool_is_closed() -> None:
    qs = [QuotaDecl("a", "p1", "alice", max_gpus=2)]
    assert admission_problem(qs, [Ask("alice", "p1", 4, None, 4.0), Ask("alice", "p2", 4, None, 4.0)]) is None
    assert admission_problem(qs, [Ask("alice", "p1", 4, None, 4.0)]) is not None
    assert admission_problem(qs, []) is None
