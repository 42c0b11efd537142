"""Errors of the plan/apply workflow; all are :class:`~rlsched.errors.RlschedError`, so the CLI prints one line.

Each carries the data a caller may want (the lock holder, the serials, the node)
so that tests and wrappers do not have to parse messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlsched.errors import RlschedError

if TYPE_CHECKING:
    from rlsched.plan.state import LockInfo


class StateError(RlschedError):
    """A state file that cannot be read, parsed or written."""


class StateLockedError(StateError):
    """Another process holds the state lock (after waiting ``--lock-timeout``)."""

    def __init__(self, holder: LockInfo | None, path: str) -> None:
        self.holder = holder
        self.path = path
        if holder is None:
            msg = f"state locked ({path}.lock held by an unknown process); wait, or remove the lock file"
        else:
            msg = (f"state locked by {holder.op} (pid {holder.pid} on {holder.host}, since {holder.started}); "
                   f"wait or run rlsched force-unlock {holder.id}")
        super().__init__(msg)


class PlanError(RlschedError):
    """A plan that cannot be made, saved or loaded."""


class StalePlanError(PlanError):
    """A saved plan whose state lineage or serial no longer matches the state (Terraform's "Saved plan is stale")."""


class ApplyError(RlschedError):
    """Apply stopped; the state holds what was done and the next plan shows the rest."""


class NodeChangedError(ApplyError):
    """A node's declared attributes changed between plan and apply; nothing was done to it."""

    def __init__(self, hostname: str, what: str) -> None:
        self.hostname = hostname
        self.what = what
        super().__init__(f"{hostname} changed since plan ({what}); run plan again")


class ApprovalError(ApplyError):
    """The user did not type ``yes``."""
