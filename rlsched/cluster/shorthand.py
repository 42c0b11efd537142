"""Parse the compact ``--cluster`` syntax into pool specifications.

Grammar (comma-separated groups)::

    [KIND:][MIN-]NODESxGPUSxMODEL[/OPTION...]

KIND is ``onprem`` (default), ``spot`` or ``ondemand``. For on-prem pools
``NODES`` is the fixed size; for elastic pools ``MIN-MAX`` bounds it (``0-32``)
and a bare number means ``0-NODES``. Options after ``/``:

* ``mig`` or ``mig=LAYOUT`` - MIG mode with a named layout (``balanced``,
  ``all-1g``, ``all-2g``, ``all-3g``, ``mixed-4-3``, ``all-7g``) or profiles joined
  by ``+`` (``3g.40gb+3g.40gb``); plain ``mig`` is ``balanced``.
* ``ts=N`` - time-slicing with N replicas per GPU.
* ``cost=X`` - USD per GPU-hour (fixed; otherwise the market price, 0 on-prem).
* ``cpus=N``, ``mem=GiB`` - host resources per node.
* ``delay=S`` - provisioning delay of elastic nodes in seconds; ``idle=S`` - idle stop.
* ``region=R`` - market region.
* ``gang=MODE`` - where a job larger than one node takes its GPUs: ``whole-nodes``
  (default: ``n // G`` free nodes plus one node for the remainder, as real fleets and
  the Tiresias and Lucid simulators) or ``packed`` (any free GPUs, fewest nodes first,
  no speed cost; optimistic). See :class:`~rlsched.cluster.model.GangMode`.

Examples: ``12x8xA100-80GB``, ``spot:0-32x8xH100-80GB``,
``2x8xA100-80GB/mig=balanced,ondemand:0-4x8xH100-80GB``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from rlsched.cluster.catalog import GpuModel, gpu_model
from rlsched.cluster.feasibility import named_layouts, resolve_layout
from rlsched.cluster.model import GangMode, PoolKind, PoolSpec, Sharing
from rlsched.cluster.provisioning import provision_delay_s
from rlsched.errors import ClusterSpecError, RlschedError

_GROUP = re.compile(
    r"^(?:(?P<kind>[a-z_-]+):)?(?:(?P<min>\d+)-)?(?P<nodes>\d+)x(?P<gpus>\d+)x(?P<model>[^/]+)(?P<opts>(?:/[^/]+)*)$"
)
_KINDS = {"onprem": PoolKind.ONPREM, "on_prem": PoolKind.ONPREM, "spot": PoolKind.SPOT,
          "ondemand": PoolKind.ONDEMAND, "on_demand": PoolKind.ONDEMAND}


def resolve_layout_text(model: GpuModel, text: str) -> tuple[str, ...]:
    """:func:`resolve_layout` for a layout typed by a user: a misspelt layout name gets a did-you-mean.

    ``balancd`` is not a MIG profile either, so without this the error would list the
    profiles and never mention the named layout the user meant.
    """
    try:
        return resolve_layout(model, text)
    except RlschedError as exc:
        if "+" in text or "," in text:
            raise
        names: Sequence[str] = list(named_layouts(model))
        close = difflib.get_close_matches(text, names, n=1, cutoff=0.6)
        if not close:
            raise
        raise type(exc)(f"{text!r} is neither a named MIG layout ({', '.join(named_layouts(model))}) nor a MIG "
                        f"profile of {model.name}. Did you mean {close[0]!r}?") from None


def parse_cluster(spec: str) -> list[PoolSpec]:
    """Parse a ``--cluster`` string; raises :class:`ClusterSpecError` naming the bad group."""
    groups = [g.strip() for g in spec.split(",") if g.strip()]
    if not groups:
        raise ClusterSpecError("empty cluster spec; expected e.g. 4x8xA100-80GB")
    pools: list[PoolSpec] = []
    names: dict[str, int] = {}
    for pos, group in enumerate(groups, 1):
        try:
            pools.append(_parse_group(group, names))
        except ClusterSpecError as exc:
            raise ClusterSpecError(f"cluster spec group {pos} {group!r}: {exc}") from None
        except RlschedError as exc:
            raise ClusterSpecError(f"cluster spec group {pos} {group!r}: {exc}") from None
    return pools


def _parse_group(group: str, names: dict[str, int]) -> PoolSpec:
    m = _GROUP.match(group.strip())
    if m is None and ":" in group:
        kind, _, rest = group.partition(":")
        m = _GROUP.match(f"{kind.lower()}:{rest}")
    if m is None:
        raise ClusterSpecError("does not parse; expected [KIND:][MIN-]NODESxGPUSxMODEL[/mig|/ts=N|...]")
    kind_s = (m["kind"] or "onprem").lower()
    if kind_s not in _KINDS:
        raise ClusterSpecError(f"unknown pool kind {kind_s!r}; use onprem, spot or ondemand")
    kind = _KINDS[kind_s]
    model = gpu_model(m["model"])
    nodes, gpus = int(m["nodes"]), int(m["gpus"])
    if gpus < 1 or gpus > 16:
        raise ClusterSpecError(f"{gpus} GPUs per node is out of range 1..16")
    lo = int(m["min"]) if m["min"] is not None else (nodes if kind is PoolKind.ONPREM else 0)
    if kind is PoolKind.ONPREM and m["min"] is not None and lo != nodes:
        raise ClusterSpecError("an on-prem pool has a fixed size; use spot: or ondemand: for MIN-MAX")
    if lo > nodes:
        raise ClusterSpecError(f"minimum {lo} exceeds maximum {nodes}")
    if nodes < 1:
        raise ClusterSpecError("a pool needs at least one node (maximum)")
    sharing, replicas = Sharing.EXCLUSIVE, 1
    layout: tuple[str, ...] = ()
    extra: dict[str, object] = {}
    for opt in filter(None, m["opts"].split("/")):
        key, _, val = opt.partition("=")
        key = key.lower()
        try:
            if key == "mig":
                sharing = Sharing.MIG
                layout = resolve_layout_text(model, val or "balanced")
            elif key == "ts":
                sharing, replicas = Sharing.TIMESLICE, int(val)
                if replicas < 1:
                    raise ClusterSpecError("ts=N needs N >= 1")
            elif key == "cost":
                extra["cost_per_gpu_hour"] = float(val)
            elif key == "cpus":
                extra["cpus_per_node"] = float(val)
            elif key == "mem":
                extra["mem_mib_per_node"] = int(float(val) * 1024)
            elif key == "delay":
                extra["provision_delay_s"] = float(val)
            elif key == "idle":
                extra["idle_stop_s"] = float(val)
            elif key == "region":
                extra["region"] = val
            elif key == "gang":
                extra["gang"] = parse_gang_mode(val)
            else:
                raise ClusterSpecError(
                    f"unknown option /{key}; known: mig, ts, cost, cpus, mem, delay, idle, region, gang")
        except ValueError:
            raise ClusterSpecError(f"option /{opt} needs a number") from None
    if "provision_delay_s" not in extra:
        extra["provision_delay_s"] = provision_delay_s(kind, model)
    base = f"{kind.value}-{model.name.lower()}"
    names[base] = names.get(base, 0) + 1
    name = base if names[base] == 1 else f"{base}-{names[base]}"
    return PoolSpec(
        name=name, kind=kind, model=model, gpus_per_node=gpus, min_nodes=lo, max_nodes=nodes,
        sharing=sharing, replicas=replicas, mig_layout=layout,
        **extra,  # type: ignore[arg-type]
    )


def parse_gang_mode(value: object) -> GangMode:
    """A gang mode by name (``whole-nodes`` or ``packed``); raises :class:`ClusterSpecError` otherwise."""
    try:
        return GangMode(str(value).strip().lower())
    except ValueError:
        known = ", ".join(m.value for m in GangMode)
        raise ClusterSpecError(f"unknown gang mode {value!r}; known: {known}") from None


def format_cluster(pools: list[PoolSpec]) -> str:
    """The ``--cluster`` string for ``pools`` (inverse of :func:`parse_cluster` for its fields)."""
    parts = []
    for p in pools:
        size = f"{p.max_nodes}" if p.kind is PoolKind.ONPREM else f"{p.min_nodes}-{p.max_nodes}"
        kind = "" if p.kind is PoolKind.ONPREM else f"{p.kind.value}:"
        opt = ""
        if p.sharing is Sharing.MIG:
            from rlsched.cluster.feasibility import named_layouts

            names = {tuple(sorted(v)): k for k, v in named_layouts(p.model).items()}
            opt = "/mig=" + names.get(tuple(sorted(p.mig_layout)), "+".join(p.mig_layout))
        elif p.sharing is Sharing.TIMESLICE:
            opt = f"/ts={p.replicas}"
        if p.gang is not GangMode.WHOLE_NODES:
            opt += f"/gang={p.gang.value}"
        parts.append(f"{kind}{size}x{p.gpus_per_node}x{p.model.name}{opt}")
    return ",".join(parts)
