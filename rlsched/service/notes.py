"""Decisions the service did not apply, recorded once per state of the cluster.

A policy that keeps proposing the same refused decision (an illegal placement, a pool over quota, a
``Reconfigure`` that is not safe now) would otherwise fill the decision log at every pass: a refusal is
recorded the first time it is seen, and again only after the cluster changed (:meth:`DecisionNotes.clear`).
"""

from __future__ import annotations

from typing import Any

from rlsched.runtime.store import Store


class DecisionNotes:
    """The refusals already recorded since the cluster last changed (see the module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._noted: set[tuple[str, ...]] = set()

    def clear(self) -> None:
        """The cluster changed: a refusal seen again is recorded again."""
        self._noted.clear()

    def note(self, kind: str, job: str | None, payload: dict[str, Any], reason: str, source: str,
             version: str) -> bool:
        """Record a decision that was not applied (once per state of the cluster); True if recorded now."""
        key = (kind, job or "", reason)
        if key in self._noted:
            return False
        self._noted.add(key)
        self.store.append_decision(kind, payload, applied=False, job=job, policy=source, model_version=version,
                                   reason=reason)
        return True
