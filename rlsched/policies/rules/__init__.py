"""The rules a learned policy is trained and served behind (they act before the network).

* :mod:`~rlsched.policies.rules.chain` - what a rule is, building the rules from their
  parameters, running them in order, and :class:`RuledScheduler` (a scheduler behind rules);
* :mod:`~rlsched.policies.rules.deadline_guard` - urgent deadline jobs to safe capacity;
* :mod:`~rlsched.policies.rules.consolidate` - empty lightly used elastic nodes;
* :mod:`~rlsched.policies.rules.preempt_long` - suspend a far longer job for a blocked short one;
* :mod:`~rlsched.policies.rules.mig_resplit` - re-split idle MIG GPUs for blocked jobs;
* :mod:`~rlsched.policies.rules.victims` - which running jobs to stop for room.
"""

from rlsched.policies.rules.chain import (
    RULES,
    Rule,
    RuledScheduler,
    RuleParams,
    build_rules,
    owned_actions,
    rule_file,
    run_rules,
)

__all__ = ["RULES", "Rule", "RuleParams", "RuledScheduler", "build_rules", "owned_actions", "rule_file", "run_rules"]
