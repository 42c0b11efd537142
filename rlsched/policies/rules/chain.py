"""The rules a learned policy is trained and served behind.

Some decisions are better made by a rule than learned: they are rare (a deadline job
about to become unreachable), or they need a many-step plan the policy's one
decision per step cannot express (suspend this job, place it there, release that
node). A rule acts first at every decision point; the network acts on what it leaves.
The same rules run in the environment after every advance of time during training
(so PPO learns on the states serving will show) and in front of the network when the
model is served, because a model saved with them carries their parameters - one JSON
file per rule in its folder, named after the rule's experiment key.

The rules, in the order they act:

* ``deadline_guard`` - :class:`~rlsched.policies.rules.deadline_guard.DeadlineGuard`: urgent
  deadline jobs go to safe capacity (or have it bought, or have room made);
* ``consolidate`` - :class:`~rlsched.policies.rules.consolidate.Consolidator`: the jobs of a
  lightly used elastic node move to busier ones so that the node can be released;
* ``preempt_long`` - :class:`~rlsched.policies.rules.preempt_long.LongJobPreemption`: a short
  job that cannot start anywhere has a far longer preemptible job suspended for it;
* ``mig_resplit`` - :class:`~rlsched.policies.rules.mig_resplit.MigResplit`: idle MIG GPUs are
  re-split for blocked jobs no free instance serves.

A rule may *own* action kinds (``owns``, e.g. ``{"reconfigure"}``): a policy trained behind it
has those actions masked, in training and serving alike, and never learns them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from rlsched.cluster.decisions import Decision
from rlsched.cluster.model import ClusterState
from rlsched.policies.rules.consolidate import Consolidator
from rlsched.policies.rules.deadline_guard import DeadlineGuard
from rlsched.policies.rules.mig_resplit import MigResplit
from rlsched.policies.rules.preempt_long import LongJobPreemption

__all__ = ["RULES", "Rule", "RuledScheduler", "build_rules", "owned_actions", "rule_file", "run_rules"]


class Rule(Protocol):
    """What a rule is: a scheduler whose decisions are applied one by one as they are yielded.

    ``releases_nodes``: its decisions only pay if the caller applies its scale-downs (a
    caller that cannot - the live service, where plan/apply owns pool sizes - leaves it out).
    """

    releases_nodes: bool

    def reset(self, state: ClusterState) -> None: ...

    def decide(self, state: ClusterState) -> Iterator[Decision]: ...


#: rule name (experiment key and model file stem) -> its class, in the order rules act
RULES: dict[str, type[DeadlineGuard] | type[Consolidator] | type[LongJobPreemption] | type[MigResplit]] = {
    "deadline_guard": DeadlineGuard,
    "consolidate": Consolidator,
    "preempt_long": LongJobPreemption,
    "mig_resplit": MigResplit,
}

RuleParams = Mapping[str, Mapping[str, Any] | None]


def rule_file(name: str) -> str:
    """The model-folder file that carries rule ``name``'s parameters."""
    return f"{name}.json"


def build_rules(params: RuleParams | None) -> list[Rule]:
    """Fresh rules from ``{name: constructor arguments}`` (a None value: that rule is off).

    Raises:
        ValueError: an unknown rule name or bad arguments (naming the rule).
    """
    params = params or {}
    unknown = sorted(set(params) - set(RULES))
    if unknown:
        raise ValueError(f"unknown rule(s) {unknown}; known: {', '.join(RULES)}")
    rules: list[Rule] = []
    for name, cls in RULES.items():
        args = params.get(name)
        if args is None:
            continue
        try:
            rules.append(cls(**args))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    return rules


def owned_actions(params: RuleParams | None) -> frozenset[str]:
    """The action kinds the rules of ``params`` own (masked for a policy trained behind them)."""
    out: frozenset[str] = frozenset()
    for name, args in (params or {}).items():
        cls = RULES.get(name)
        if args is not None and cls is not None:
            out |= getattr(cls, "owns", frozenset())
    return out


def run_rules(rules: Sequence[Rule], state: ClusterState) -> Iterator[Decision]:
    """Every rule's decisions, in order (the caller applies each as it is yielded)."""
    for rule in rules:
        yield from rule.decide(state)


class RuledScheduler:
    """Any scheduler with rules in front: each rule acts, then ``inner`` decides.

    What :class:`~rlsched.learned.ppo.PpoScheduler` does with the rules a model was
    trained behind, for schedulers that were not trained at all - e.g. a heuristic with
    node consolidation, to see how much of a rule's saving any policy would get
    (``benchmarks/cost_report.py --baseline-rules``).
    """

    def __init__(self, inner: Any, rules: list[Rule]) -> None:
        self.inner = inner
        self.rules = rules
        self.name = str(getattr(inner, "name", "scheduler"))

    def reset(self, state: ClusterState) -> None:
        for rule in self.rules:
            rule.reset(state)
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        yield from run_rules(self.rules, state)
        yield from self.inner.decide(state)
