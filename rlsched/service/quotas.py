"""Quotas: pure functions over the spec's ``quota`` blocks and what principals hold.

A ``quota`` block limits one principal in one pool::

    quota "team_a" { pool = pool.onprem  principal = "team-a"  max_gpus = 8  max_gpu_hours_per_day = 100 }

Semantics (the service applies them; nothing here touches a store or a clock):

* **Principal.** A job's ``user`` matches a quota's ``principal`` when they are
  equal, when the principal is ``user:<user>``, or when the principal is ``*``.
  (Group membership has no source yet: submit as ``group:interns`` to be counted
  against that group's quota.)
* **Units.** ``max_gpus`` counts whole GPUs; ``max_slices`` counts MIG instances
  per profile (a profile the map does not list is not limited by it); GPUs and
  slices are distinct units, as the spec says. ``max_gpu_hours_per_day`` counts
  GPU-hours (an instance counts its compute share, g/7) used by running and
  finished jobs over the last 24 hours.
* **Admission** refuses a request that can never fit a quota of the pool it must
  run in (16 GPUs under ``max_gpus = 8``, a profile limited to 0, an estimated
  duration over the daily GPU-hours); see :func:`never_fits`.
* **Pending.** A request within the quota but over what is left of it right now
  stays queued and is not shown to the policy; :func:`over_quota` gives the
  reason users see (``quota team_a: 7/8 GPUs in use``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rlsched.cluster.feasibility import profile_for
from rlsched.cluster.model import PoolSpec, Sharing
from rlsched.runtime.store import JobRecord
from rlsched.spec.model import QuotaDecl

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Holding:
    """What one job holds (or held) in a pool, for quota accounting.

    Attributes:
        user: the job's principal.
        pool: the pool its allocation is in.
        gpus: whole GPUs (0 for a MIG instance).
        profile: the MIG profile of its instance, if it holds one.
        share: GPU-equivalents for GPU-hours (``gpus``, or an instance's g/7).
        started_at / finished_at: the run (``finished_at`` None while it runs).
    """

    user: str
    pool: str
    gpus: int = 0
    profile: str | None = None
    share: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def active(self) -> bool:
        return self.finished_at is None


@dataclass(frozen=True, slots=True)
class Ask:
    """A request as a quota sees it: who, in which pool, how much."""

    user: str
    pool: str
    gpus: int = 0
    profile: str | None = None
    share: float = 0.0
    estimated_duration_s: float | None = None


@dataclass(slots=True)
class Usage:
    """A principal's current use of one pool under one quota."""

    gpus: int = 0
    slices: dict[str, int] = field(default_factory=dict)
    gpu_hours: float = 0.0


def principal_matches(principal: str, user: str) -> bool:
    """True if a job of ``user`` counts against a quota for ``principal``."""
    return principal in ("*", user) or principal == f"user:{user}"


def quotas_for(quotas: Iterable[QuotaDecl], user: str, pool: str) -> list[QuotaDecl]:
    """The quotas limiting ``user`` in ``pool`` (declaration order)."""
    return [q for q in quotas if q.pool == pool and principal_matches(q.principal, user)]


def usage(quota: QuotaDecl, holdings: Iterable[Holding], now: float) -> Usage:
    """What the quota's principal holds in its pool now, and GPU-hours over the last 24 h."""
    out = Usage()
    since = now - DAY_S
    for h in holdings:
        if h.pool != quota.pool or not principal_matches(quota.principal, h.user):
            continue
        if h.active:
            out.gpus += h.gpus
            if h.profile is not None:
                out.slices[h.profile] = out.slices.get(h.profile, 0) + 1
        if h.started_at is not None:
            end = now if h.finished_at is None else min(h.finished_at, now)
            start = max(h.started_at, since)
            if end > start:
                out.gpu_hours += h.share * (end - start) / 3600.0
    return out


def never_fits(quota: QuotaDecl, ask: Ask) -> str | None:
    """Why ``ask`` can never run under ``quota`` (None if it can once the principal's jobs end)."""
    who = f"{quota.principal} in pool {quota.pool}"
    if ask.profile is None and quota.max_gpus is not None and ask.gpus > quota.max_gpus:
        return (f"quota {quota.name} allows {who} at most {quota.max_gpus} GPUs; "
                f"the job asks for {ask.gpus}")
    if ask.profile is not None and ask.profile in quota.max_slices and quota.max_slices[ask.profile] < 1:
        return f"quota {quota.name} allows {who} no {ask.profile} instances"
    if quota.max_gpu_hours_per_day is not None and ask.estimated_duration_s is not None:
        need = ask.share * ask.estimated_duration_s / 3600.0
        if need > quota.max_gpu_hours_per_day:
            return (f"quota {quota.name} allows {who} {quota.max_gpu_hours_per_day:g} GPU-hours per day; "
                    f"the job's estimate needs {need:.1f}")
    return None


def over_quota(quota: QuotaDecl, used: Usage, ask: Ask) -> str | None:
    """Why ``ask`` must wait under ``quota`` given current ``used`` (None if it may start now)."""
    if ask.profile is None and quota.max_gpus is not None and used.gpus + ask.gpus > quota.max_gpus:
        return f"quota {quota.name}: {used.gpus}/{quota.max_gpus} GPUs in use"
    if ask.profile is not None and ask.profile in quota.max_slices:
        limit = quota.max_slices[ask.profile]
        have = used.slices.get(ask.profile, 0)
        if have + 1 > limit:
            return f"quota {quota.name}: {have}/{limit} {ask.profile} instances in use"
    if quota.max_gpu_hours_per_day is not None and used.gpu_hours >= quota.max_gpu_hours_per_day:
        return (f"quota {quota.name}: {used.gpu_hours:.1f}/{quota.max_gpu_hours_per_day:g} GPU-hours "
                f"used in the last 24h")
    return None


def admission_problem(quotas: Iterable[QuotaDecl], asks: Iterable[Ask]) -> str | None:
    """Why a request can never run, given one :class:`Ask` per pool it could run in.

    The request is refused only if EVERY pool it could run in has a quota it can
    never fit; the first such quota's message is returned.
    """
    qs = list(quotas)
    first: str | None = None
    any_pool = False
    for ask in asks:
        any_pool = True
        why = next((w for q in quotas_for(qs, ask.user, ask.pool) if (w := never_fits(q, ask))), None)
        if why is None:
            return None
        first = first or why
    return first if any_pool else None


def blocking(quotas: Iterable[QuotaDecl], holdings: Iterable[Holding], ask: Ask, now: float) -> str | None:
    """The first quota that makes ``ask`` wait now (None if every quota has room)."""
    hs = list(holdings)
    for q in quotas_for(quotas, ask.user, ask.pool):
        why = over_quota(q, usage(q, hs, now), ask)
        if why is not None:
            return why
    return None


# --------------------------------------------------------------------------- job records


def ask_of(rec: JobRecord, spec: PoolSpec) -> Ask:
    """A job's request as a quota of pool ``spec`` sees it."""
    est = (rec.options or {}).get("estimated_duration_s")
    est_f = float(est) if est else None
    if spec.sharing is Sharing.MIG:
        prof = profile_for(spec.model, rec.num_gpus, rec.gpu_milli)
        name = prof.name if prof is not None else rec.mig_profile
        share = prof.fraction if prof is not None else rec.gpu_milli / 1000
        return Ask(rec.user, spec.name, 0, name, share, est_f)
    share = rec.gpu_milli / 1000 if rec.num_gpus == 1 and rec.gpu_milli < 1000 else float(rec.num_gpus)
    return Ask(rec.user, spec.name, rec.num_gpus, None, share, est_f)


def holding_of(rec: JobRecord, pools: dict[str, PoolSpec]) -> Holding | None:
    """What a job with an allocation holds (or held, if finished); None without one."""
    alloc = rec.allocation
    if alloc is None:
        return None
    spec = pools.get(alloc.pool)
    profile = None
    if alloc.slice_start is not None:
        prof = profile_for(spec.model, rec.num_gpus, rec.gpu_milli) if spec is not None else None
        profile = prof.name if prof is not None else rec.mig_profile
        share = prof.fraction if prof is not None else rec.gpu_milli / 1000
        gpus = 0
    else:
        gpus = len(alloc.devices)
        share = float(gpus)
    finished = rec.finished_at if rec.state.terminal else None
    return Holding(rec.user, alloc.pool, gpus, profile, share, rec.started_at, finished)
