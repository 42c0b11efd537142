"""Seeded synthetic workload *families*: whole classes of clusters and traces, not one file.

A learned scheduler is only worth deploying if it holds up on workloads it has never
seen. Real public traces are few (Philly, the Alibaba openb sets), so judging a model
on them alone rewards memorising one cluster's habits. A :class:`FamilySpec` describes
a workload family by its *distributions* - a heavy-tailed duration mixture, a GPU-count
mix (fractional / MIG-sized requests and multi-node gangs included), an arrival process
(Poisson or bursty), an offered load, a fleet size and an initial backlog - and
:func:`generate` draws a concrete trace from it for a seed. Different seeds give
different windows of the same family; different families differ in kind.

:data:`FAMILIES` names a set of documented families that the generalisation benchmark
(``benchmarks/generalisation.py``) evaluates on, and :func:`random_family` draws a
family at random inside the documented ranges, which is what domain-randomised training
samples from. Every draw is a pure function of its seed (NumPy's PCG64), so a benchmark
number can be reproduced from its command line.

How arrivals meet the load: the jobs are drawn first, their total work ``W``
(GPU-seconds, fractional shares counted by their share) fixes the submission span
``W / (load x fleet GPUs)``, and ``n`` arrival times are placed in that span by the
arrival process. For a bursty family the intensity alternates between a calm level and
``burst_factor`` times it, in periods of exponential length, and arrivals are the
order statistics of that inhomogeneous process conditioned on ``n`` events (inverse
transform of the cumulative intensity), so the *offered* load is exactly ``load``
while the instantaneous load swings. ``backlog_jobs`` of the jobs are submitted at
time 0, a queue that is deep from the start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from rlsched.cluster.job import Job
from rlsched.errors import RlschedError, name_hint
from rlsched.workload.trace import Trace

#: MIG-sized shares of one A100/H100 (x1000): 1g, 2g, 3g, 4g of 7 compute slices.
MIG_SHARES = (142, 285, 428, 571)


class GeneratorError(RlschedError):
    """A family specification that cannot produce a workload (the message names the field)."""


@dataclass(frozen=True)
class DurationComponent:
    """One log-normal component of a duration mixture.

    Attributes:
        weight: relative weight of the component (> 0).
        median_s: median duration in seconds (> 0).
        sigma: standard deviation of ``log(duration)``; 0 gives a constant, 2 a heavy tail.
    """

    weight: float
    median_s: float
    sigma: float


@dataclass(frozen=True)
class FamilySpec:
    """The distributions a workload family is drawn from (see the module docstring).

    Attributes:
        name: family name; job ids are ``NAME-SEED-I``.
        jobs: jobs per drawn trace.
        durations: the duration mixture.
        gpu_mix: ``(num_gpus, weight)`` pairs; gangs larger than a node are allowed
            up to the whole fleet.
        fractional: share of one-GPU jobs that ask for a MIG-sized fraction of a GPU
            (one of :data:`MIG_SHARES`) instead of a whole one.
        size_exponent: durations are multiplied by ``num_gpus ** size_exponent`` -
            in real traces big jobs also tend to run longer (0 = independent).
        load: offered load (work / fleet capacity over the submission span).
        nodes: fleet size in nodes.
        gpus_per_node: GPUs per node.
        gpu_model: the catalogue model of the fleet.
        mig: a named MIG layout (e.g. ``balanced``) for ``mig_nodes`` of the nodes.
        mig_nodes: nodes split into ``mig`` (a separate pool); the rest stay whole,
            since multi-GPU jobs cannot run on MIG instances.
        burst_factor: intensity of a burst relative to the calm level (1 = Poisson).
        burst_share: fraction of the span spent in bursts.
        burst_len_s: mean length of one burst.
        backlog_jobs: jobs submitted at time 0 (a deep queue from the start).
        preemptible: share of jobs that tolerate preemption.
        users: tenants, drawn Zipf-like (a few heavy users, many light ones).
        user_sigma: each user's durations are scaled by ``exp(N(0, user_sigma))`` drawn
            once per user - real users repeat similar jobs, which is what duration
            estimates learnt per user (and SJF on them) exploit; 0 = users say nothing.
    """

    name: str
    jobs: int = 2000
    durations: tuple[DurationComponent, ...] = (
        DurationComponent(0.5, 300.0, 1.0),
        DurationComponent(0.35, 3600.0, 1.0),
        DurationComponent(0.15, 6 * 3600.0, 1.0),
    )
    gpu_mix: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.1), (4, 0.1), (8, 0.1))
    fractional: float = 0.0
    size_exponent: float = 0.0
    load: float = 0.9
    nodes: int = 16
    gpus_per_node: int = 8
    gpu_model: str = "A100-80GB"
    mig: str = ""
    mig_nodes: int = 0
    burst_factor: float = 1.0
    burst_share: float = 0.0
    burst_len_s: float = 3 * 3600.0
    backlog_jobs: int = 0
    preemptible: float = 0.0
    users: int = 24
    user_sigma: float = 0.8
    description: str = field(default="", compare=False)

    @property
    def cluster(self) -> str:
        """The ``--cluster`` string of the family's fleet."""
        whole = self.nodes - self.mig_nodes
        parts = [f"{whole}x{self.gpus_per_node}x{self.gpu_model}"] if whole else []
        if self.mig_nodes:
            parts.append(f"{self.mig_nodes}x{self.gpus_per_node}x{self.gpu_model}/mig={self.mig}")
        return ",".join(parts)

    def validate(self) -> None:
        """Raise :class:`GeneratorError` naming the first impossible parameter."""
        def bad(what: str, why: str) -> GeneratorError:
            return GeneratorError(f"family {self.name!r}: {what} {why}")

        if self.jobs < 1:
            raise bad("jobs", f"must be >= 1, got {self.jobs}")
        if not math.isfinite(self.load) or not 0 < self.load <= 10:
            raise bad("load", f"must be in (0, 10], got {self.load}")
        if not 1 <= self.nodes <= 100_000:
            raise bad("nodes", f"must be in 1..100000, got {self.nodes}")
        if not 1 <= self.gpus_per_node <= 16:
            raise bad("gpus_per_node", f"must be in 1..16, got {self.gpus_per_node}")
        if not self.durations:
            raise bad("durations", "needs at least one component")
        for i, c in enumerate(self.durations):
            if not (c.weight > 0 and math.isfinite(c.weight)):
                raise bad(f"durations[{i}].weight", f"must be > 0, got {c.weight}")
            if not (c.median_s > 0 and math.isfinite(c.median_s)):
                raise bad(f"durations[{i}].median_s", f"must be > 0, got {c.median_s}")
            if not 0 <= c.sigma <= 5:
                raise bad(f"durations[{i}].sigma", f"must be in [0, 5], got {c.sigma}")
        if not self.gpu_mix:
            raise bad("gpu_mix", "needs at least one (num_gpus, weight) pair")
        if not 0 <= self.mig_nodes <= self.nodes or (self.mig_nodes and not self.mig):
            raise bad("mig_nodes", f"must be in 0..nodes ({self.nodes}) and needs a mig layout, got {self.mig_nodes}")
        if self.mig_nodes == self.nodes and any(g > 1 for g, _ in self.gpu_mix):
            raise bad("gpu_mix", "has multi-GPU jobs but every node is MIG-split (they could never run)")
        fleet = (self.nodes - self.mig_nodes) * self.gpus_per_node or self.gpus_per_node
        for g, w in self.gpu_mix:
            if g < 1:
                raise bad("gpu_mix", f"asks for {g} GPUs per job (must be >= 1)")
            if g > fleet:
                raise bad("gpu_mix", f"asks for {g} GPUs per job but the fleet has {fleet} "
                                     f"({self.nodes - self.mig_nodes} whole nodes x {self.gpus_per_node})")
            if g > self.gpus_per_node and g % self.gpus_per_node:
                raise bad("gpu_mix", f"a {g}-GPU gang is not a whole number of {self.gpus_per_node}-GPU nodes")
            if not (w > 0 and math.isfinite(w)):
                raise bad("gpu_mix", f"weight of {g} GPUs must be > 0, got {w}")
        for what, v in (("fractional", self.fractional), ("preemptible", self.preemptible),
                        ("burst_share", self.burst_share)):
            if not 0 <= v <= 1:
                raise bad(what, f"must be in [0, 1], got {v}")
        if self.fractional and not any(g == 1 for g, _ in self.gpu_mix):
            raise bad("fractional", "needs one-GPU jobs in gpu_mix to make fractional")
        if not 1 <= self.burst_factor <= 1000:
            raise bad("burst_factor", f"must be in [1, 1000], got {self.burst_factor}")
        if not self.burst_len_s > 0:
            raise bad("burst_len_s", f"must be > 0, got {self.burst_len_s}")
        if not 0 <= self.backlog_jobs <= self.jobs:
            raise bad("backlog_jobs", f"must be in 0..jobs ({self.jobs}), got {self.backlog_jobs}")
        if not -1 <= self.size_exponent <= 2:
            raise bad("size_exponent", f"must be in [-1, 2], got {self.size_exponent}")
        if self.users < 1:
            raise bad("users", f"must be >= 1, got {self.users}")
        if not 0 <= self.user_sigma <= 3:
            raise bad("user_sigma", f"must be in [0, 3], got {self.user_sigma}")


def _durations(spec: FamilySpec, rng: np.random.Generator, n: int) -> np.ndarray:
    w = np.array([c.weight for c in spec.durations], dtype=float)
    comp = rng.choice(len(w), size=n, p=w / w.sum())
    med = np.array([c.median_s for c in spec.durations])[comp]
    sig = np.array([c.sigma for c in spec.durations])[comp]
    # Clipped to [10 s, 30 days]: a log-normal with sigma 2 otherwise draws the odd
    # year-long job, which no trace has and which would dominate every mean.
    return np.clip(med * np.exp(sig * rng.standard_normal(n)), 10.0, 30 * 86400.0)


def _arrival_times(spec: FamilySpec, rng: np.random.Generator, n: int, span: float) -> np.ndarray:
    """``n`` sorted arrival times in ``[0, span]`` following the family's arrival process."""
    u = np.sort(rng.random(n))
    if spec.burst_factor <= 1 or spec.burst_share <= 0:
        return u * span
    # Alternate calm / burst periods of exponential length until the span is covered.
    calm_len = spec.burst_len_s * (1 - spec.burst_share) / max(spec.burst_share, 1e-9)
    edges, levels, t, burst = [0.0], [], 0.0, bool(rng.random() < spec.burst_share)
    while t < span:
        t += float(rng.exponential(spec.burst_len_s if burst else calm_len))
        edges.append(min(t, span))
        levels.append(spec.burst_factor if burst else 1.0)
        burst = not burst
    e = np.array(edges)
    cum = np.concatenate(([0.0], np.cumsum(np.diff(e) * np.array(levels))))
    return np.interp(u * cum[-1], cum, e)


def generate(spec: FamilySpec, seed: int = 0) -> Trace:
    """Draw one trace of ``spec`` (see the module docstring for how load and arrivals meet).

    Raises:
        GeneratorError: an impossible parameter (named).
    """
    spec.validate()
    rng = np.random.default_rng([seed, 0x5EED])
    n = spec.jobs
    sizes = np.array([g for g, _ in spec.gpu_mix])
    weights = np.array([w for _, w in spec.gpu_mix], dtype=float)
    gpus = rng.choice(sizes, size=n, p=weights / weights.sum())
    milli = np.full(n, 1000)
    if spec.fractional:
        frac = (gpus == 1) & (rng.random(n) < spec.fractional)
        milli[frac] = rng.choice(MIG_SHARES, size=int(frac.sum()))
    # Zipf-like tenants: user k has weight 1/(k+1) and a duration scale of its own.
    uw = 1.0 / np.arange(1, spec.users + 1)
    users = rng.choice(spec.users, size=n, p=uw / uw.sum())
    user_scale = np.exp(spec.user_sigma * rng.standard_normal(spec.users))
    dur = _durations(spec, rng, n) * np.power(gpus.astype(float), spec.size_exponent) * user_scale[users]
    dur = np.clip(dur, 10.0, 30 * 86400.0)
    work = float(np.sum(gpus * (milli / 1000.0) * dur))
    span = work / (spec.load * spec.nodes * spec.gpus_per_node)
    submit = _arrival_times(spec, rng, n - spec.backlog_jobs, span)
    submit = np.concatenate((np.zeros(spec.backlog_jobs), submit))
    pre = rng.random(n) < spec.preemptible
    jobs = [
        Job(job_id=f"{spec.name}-{seed}-{i}", submit_time=round(float(submit[i]), 3),
            duration=round(float(dur[i]), 3), num_gpus=int(gpus[i]), gpu_milli=int(milli[i]),
            user=f"u{int(users[i])}", preemptible=bool(pre[i]))
        for i in range(n)
    ]
    return Trace(jobs, source=f"generator:{spec.name}:{seed}")


def _mix(*pairs: tuple[int, float]) -> tuple[tuple[int, float], ...]:
    return tuple(pairs)


_D = DurationComponent

#: Documented families (README, "Workload families"). Each stresses one thing the
#: real traces show little of; ``steady`` is the plain reference.
FAMILIES: dict[str, FamilySpec] = {f.name: f for f in (
    FamilySpec("steady", description="Poisson arrivals at load 0.95 on 16 nodes; mostly 1-GPU jobs, "
               "a three-part duration mixture (5 min / 1 h / 6 h)", load=0.95),
    FamilySpec("heavy-tail", description="a wide duration mixture (sigma 2: minutes to days), load 0.9",
               durations=(_D(0.6, 120.0, 1.5), _D(0.3, 3600.0, 2.0), _D(0.1, 12 * 3600.0, 1.5)), load=0.9),
    FamilySpec("gang", description="a third of the work in 16-64 GPU multi-node gangs on 32 nodes; "
               "big jobs run longer", nodes=32, load=0.85, size_exponent=0.3,
               gpu_mix=_mix((1, 0.55), (2, 0.1), (4, 0.1), (8, 0.12), (16, 0.08), (32, 0.04), (64, 0.01))),
    FamilySpec("bursty", description="calm periods and bursts at 8x the calm rate (a fifth of the time, "
               "2 h each), load 0.9", burst_factor=8.0, burst_share=0.2, burst_len_s=2 * 3600.0, load=0.9),
    FamilySpec("overload", description="load 1.3 with 400 jobs queued at time 0: multi-day backlogs",
               load=1.3, backlog_jobs=400),
    FamilySpec("fractional", description="40% of 1-GPU jobs ask for a MIG-sized fraction, on A100s "
               "split into the balanced layout on 4 of 8 nodes", fractional=0.4, mig="balanced", mig_nodes=4,
               nodes=8, load=0.85,
               gpu_mix=_mix((1, 0.85), (2, 0.1), (4, 0.05))),
    FamilySpec("tiny-fleet", description="4 nodes at load 1.0: every long job blocks a quarter of the fleet",
               nodes=4, jobs=800, load=1.0, gpu_mix=_mix((1, 0.75), (2, 0.1), (4, 0.1), (8, 0.05))),
    FamilySpec("large-fleet", description="128 nodes at load 0.85, 6000 jobs", nodes=128, jobs=6000, load=0.85,
               gpu_mix=_mix((1, 0.6), (2, 0.1), (4, 0.1), (8, 0.15), (16, 0.04), (32, 0.01))),
    FamilySpec("light", description="load 0.5: queues are short and ordering matters little", load=0.5),
)}


def family(name: str) -> FamilySpec:
    """The named family; :class:`GeneratorError` with a suggestion for an unknown name."""
    if name in FAMILIES:
        return FAMILIES[name]
    raise GeneratorError(f"unknown workload family {name!r}{name_hint(name, FAMILIES)}; known: {', '.join(FAMILIES)}")


def random_family(rng: np.random.Generator, *, name: str = "random",
                  exclude: Sequence[str] = (), max_nodes: int = 128) -> FamilySpec:
    """A family drawn inside the documented ranges: domain randomisation for training.

    Loads 0.5-1.5, fleets of 4-128 nodes, 2-4 component duration mixtures with medians
    from 1 minute to 1 day, GPU mixes with gangs where the fleet allows them, a
    fractional share on MIG fleets, bursts in half of the draws and a backlog in a
    quarter. ``exclude`` names fixed families whose *kind* the draw must avoid
    (leave-one-family-out training): ``gang`` keeps gangs out, ``bursty`` bursts,
    ``overload`` loads above 1.1 and backlogs, ``fractional`` fractions,
    ``heavy-tail`` sigmas above 1.2, ``tiny-fleet`` fleets under 8 nodes,
    ``large-fleet`` fleets over 32 nodes, ``light`` loads under 0.7. ``max_nodes`` caps
    the fleet (training episodes of a few hundred jobs only form queues on small fleets).
    """
    ex = set(exclude)
    unknown = ex - set(FAMILIES)
    if unknown:
        raise GeneratorError(f"unknown workload family {sorted(unknown)[0]!r} in exclude; known: {', '.join(FAMILIES)}")
    nodes_choices = [n for n in (4, 8, 16, 32, 64, 128)
                     if not ("tiny-fleet" in ex and n < 8) and not ("large-fleet" in ex and n > 32) and n <= max_nodes]
    if not nodes_choices:
        raise GeneratorError(f"max_nodes {max_nodes} leaves no fleet size to draw (4-128 nodes, "
                             f"{'8' if 'tiny-fleet' in ex else '4'} at least with this exclude)")
    nodes = int(rng.choice(nodes_choices))
    mig = "" if "fractional" in ex or rng.random() < 0.75 else "balanced"
    mig_nodes = max(1, nodes // 4) if mig else 0
    lo = 0.7 if "light" in ex else 0.5
    hi = 1.1 if "overload" in ex else 1.5
    load = float(rng.uniform(lo, hi))
    max_sigma = 1.2 if "heavy-tail" in ex else 2.0
    k = int(rng.integers(2, 5))
    durations = tuple(_D(float(rng.uniform(0.2, 1.0)), float(math.exp(rng.uniform(math.log(60), math.log(86400)))),
                         float(rng.uniform(0.3, max_sigma))) for _ in range(k))
    fleet = (nodes - mig_nodes) * 8
    sizes = [1, 2, 4, 8] + ([] if "gang" in ex else [g for g in (16, 32, 64) if g <= fleet // 2])
    weights = rng.dirichlet(np.ones(len(sizes)))
    weights[0] += 1.0  # one-GPU jobs dominate every real trace
    gpu_mix = tuple((g, float(w)) for g, w in zip(sizes, weights, strict=True))
    bursty = "bursty" not in ex and rng.random() < 0.5
    backlog = 0 if "overload" in ex or rng.random() < 0.75 else int(rng.integers(50, 400))
    jobs = int(min(6000, max(600, nodes * 60)))
    return FamilySpec(
        name=name, jobs=jobs, durations=durations, gpu_mix=gpu_mix, load=load, nodes=nodes,
        fractional=float(rng.uniform(0.1, 0.5)) if mig else 0.0, mig=mig, mig_nodes=mig_nodes,
        size_exponent=float(rng.uniform(0.0, 0.4)), users=int(rng.integers(4, 64)),
        user_sigma=float(rng.uniform(0.0, 1.5)),
        burst_factor=float(rng.uniform(3, 10)) if bursty else 1.0, burst_share=float(rng.uniform(0.1, 0.3)) if bursty
        else 0.0, backlog_jobs=min(backlog, jobs // 2), preemptible=float(rng.uniform(0, 1)),
    )


def with_overrides(spec: FamilySpec, **overrides: object) -> FamilySpec:
    """``spec`` with some fields replaced (``--set load=1.2``); unknown fields are a GeneratorError."""
    known = set(FamilySpec.__dataclass_fields__)
    for key in overrides:
        if key not in known:
            raise GeneratorError(f"family {spec.name!r}: unknown parameter {key!r}; known: {', '.join(sorted(known))}")
    return replace(spec, **overrides)  # type: ignore[arg-type]
