"""Which action kinds a policy was trained with, and on which pool kinds.

A network scores every action of the codec's layout, but only the actions that were
legal somewhere in its training worlds ever received a gradient: a policy trained on
on-prem fleets has never been rewarded or punished for ``scale +1`` on a spot pool,
so those outputs are whatever the initial weights made them. Served on a fleet with
more (elastic pools, MIG pools), an untrained output can win the argmax over every
trained one, e.g. alternate ``scale +1`` / ``scale -1`` forever while placements are
legal (BENCHMARKS.md, "Models outside their training: masking and loop hand-overs").

:class:`TrainedActions` records, per action kind (place, reconfigure MIG, scale up,
scale down), the pool kinds (on-prem, on-demand, spot) on which that kind was legal
in training, plus whether waiting was. The trainer writes it into the model folder
(:data:`ACTIONS_FILE`); :class:`~rlsched.envs.codec.ObservationCodec` masks every
action outside it when the model is served or simulated; and
:class:`~rlsched.learned.ppo.PpoScheduler` hands the kinds the model lacks to a
heuristic (see there), so the capacity the model cannot touch is still used.

Preemption of a running job (the codec's opt-in ``preempt_slots``) is not a pool action:
it is recorded as one flag, ``preempt``, true when the model's codec had preempt slots in
training. A record without the flag (every record written before it existed) means the
model was never trained to preempt, and its codec masks those actions.

A rule the policy is trained behind may own an action kind (the MIG re-split rule owns
``reconfigure``): the record then leaves that kind out, so the codec masks it in training
and serving alike, and the complementing heuristic leaves it to the rule.

The record is derived from the training fleets, not from the actions the policy
happened to take: an action kind counts as trained on a pool kind when some training
world has a controllable pool (within the codec's ``max_pools``) of that kind where
the action can be legal - every pool for place; MIG pools (with layout slots) for
reconfigure; elastic pools whose node count can move for scale up and down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rlsched.cluster.model import PoolKind, PoolSpec, Sharing

#: The record's file name in a model folder.
ACTIONS_FILE = "actions.json"
#: Bumped when the meaning of the record's fields changes.
ACTIONS_FORMAT = 1
#: Action kinds that act on a pool, in the codec's action order.
POOL_ACTIONS: tuple[str, ...] = ("place", "reconfigure", "scale_up", "scale_down")
_KINDS = {k.value: k for k in PoolKind}


@dataclass(frozen=True)
class TrainedActions:
    """Action kind -> pool kinds it was trained on, and whether waiting was.

    Attributes:
        place, reconfigure, scale_up, scale_down: the pool kinds on which each action
            kind was legal in training.
        wait: whether waiting was a trained action (always true for the codec's
            layout; kept so a record states every kind the codec has).
        preempt: whether preempting a running job was a trained action (the codec had
            preempt slots in training).
        source: where the record comes from (the training worlds, an experiment, or
            the conservative default for a model folder without one).
    """

    place: frozenset[PoolKind]
    reconfigure: frozenset[PoolKind]
    scale_up: frozenset[PoolKind]
    scale_down: frozenset[PoolKind]
    wait: bool = True
    source: str = ""
    preempt: bool = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def unrestricted(cls, source: str = "unrestricted") -> TrainedActions:
        """Every action on every pool kind (what a training environment offers)."""
        every = frozenset(PoolKind)
        return cls(every, every, every, every, True, source, preempt=True)

    @classmethod
    def conservative(cls, source: str) -> TrainedActions:
        """Placement on every pool kind and waiting; no MIG reconfiguration, no scaling.

        The record assumed for a model folder without :data:`ACTIONS_FILE`: every
        training world has a pool to place in and a moment to wait, so those outputs
        are trained whatever the fleet was; reconfiguration, scaling and preemption exist
        only on some fleets or codecs, so without a record they are treated as never
        learned (the heuristic that complements the model takes them).
        """
        return cls(frozenset(PoolKind), frozenset(), frozenset(), frozenset(), True, source)

    @classmethod
    def of_fleets(cls, fleets: Iterable[Sequence[PoolSpec]], *, max_pools: int, layouts: int,
                  source: str, preempt_slots: int = 0) -> TrainedActions:
        """The actions legal somewhere in ``fleets`` (each a pool list in declared order).

        Pools past ``max_pools`` are not controllable by the codec, so they teach nothing.
        Preemption counts as trained when the codec had ``preempt_slots`` (> 0).
        """
        place: set[PoolKind] = set()
        reconf: set[PoolKind] = set()
        scale: set[PoolKind] = set()
        for pools in fleets:
            for spec in list(pools)[:max_pools]:
                place.add(spec.kind)
                if spec.sharing is Sharing.MIG and layouts > 0:
                    reconf.add(spec.kind)
                if spec.kind.elastic and spec.max_nodes > spec.min_nodes:
                    scale.add(spec.kind)
        return cls(frozenset(place), frozenset(reconf), frozenset(scale), frozenset(scale), True, source,
                   preempt=preempt_slots > 0)

    @classmethod
    def behind_rules(cls, owned: Iterable[str], source: str) -> TrainedActions | None:
        """What a training environment or teacher offers behind rules owning ``owned``: every action
        but those (None when the rules own nothing: no restriction at all)."""
        owned = frozenset(owned)
        return cls.unrestricted(source).without(owned) if owned else None

    def without(self, kinds: Iterable[str]) -> TrainedActions:
        """This record with the pool action ``kinds`` removed (those a rule owns: the rule takes them)."""
        drop = set(kinds)
        none: frozenset[PoolKind] = frozenset()
        return replace(self, place=none if "place" in drop else self.place,
                       reconfigure=none if "reconfigure" in drop else self.reconfigure,
                       scale_up=none if "scale_up" in drop else self.scale_up,
                       scale_down=none if "scale_down" in drop else self.scale_down)

    # ------------------------------------------------------------------ queries
    def allows(self, action: str, kind: PoolKind) -> bool:
        """True if ``action`` (one of :data:`POOL_ACTIONS`) was trained on pools of ``kind``."""
        kinds: frozenset[PoolKind] = getattr(self, action)
        return kind in kinds

    def covers(self, pools: Sequence[PoolSpec], *, max_pools: int, layouts: int) -> bool:
        """True if every action a codec of this shape offers on ``pools`` lies inside this record."""
        wider = TrainedActions.of_fleets([pools], max_pools=max_pools, layouts=layouts, source="")
        return all(getattr(wider, a) <= getattr(self, a) for a in POOL_ACTIONS)

    def describe(self) -> str:
        """One line, e.g. ``place: onprem; reconfigure: -; scale up: -; scale down: -; wait``."""
        parts = [f"{a.replace('_', ' ')}: {','.join(sorted(k.value for k in getattr(self, a))) or '-'}"
                 for a in POOL_ACTIONS]
        if self.preempt:
            parts.append("preempt")
        if self.wait:
            parts.append("wait")
        return "; ".join(parts)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The JSON document of :data:`ACTIONS_FILE`."""
        doc: dict[str, Any] = {"format": ACTIONS_FORMAT, "source": self.source}
        for a in POOL_ACTIONS:
            doc[a] = sorted(k.value for k in getattr(self, a))
        doc["wait"] = self.wait
        if self.preempt:  # absent means not trained: records of models without preempt slots stay as they were
            doc["preempt"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TrainedActions:
        """Parse :meth:`to_dict`'s document; a ValueError names the first bad field."""
        if not isinstance(doc, Mapping):
            raise ValueError("expected a JSON object")
        if doc.get("format") != ACTIONS_FORMAT:
            raise ValueError(f"format {doc.get('format')!r} is not {ACTIONS_FORMAT}")
        sets: dict[str, frozenset[PoolKind]] = {}
        for a in POOL_ACTIONS:
            raw = doc.get(a)
            if not isinstance(raw, list):
                raise ValueError(f"{a!r} must be a list of pool kinds ({', '.join(_KINDS)})")
            bad = [k for k in raw if k not in _KINDS]
            if bad:
                raise ValueError(f"{a!r}: unknown pool kind {bad[0]!r} (known: {', '.join(_KINDS)})")
            sets[a] = frozenset(_KINDS[k] for k in raw)
        wait = doc.get("wait", True)
        if not isinstance(wait, bool):
            raise ValueError("'wait' must be true or false")
        preempt = doc.get("preempt", False)
        if not isinstance(preempt, bool):
            raise ValueError("'preempt' must be true or false")
        return cls(sets["place"], sets["reconfigure"], sets["scale_up"], sets["scale_down"], wait,
                   str(doc.get("source", "")), preempt=preempt)
