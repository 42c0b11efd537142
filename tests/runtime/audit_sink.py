"""An audit sink for tests: keeps the records the guard sends, to assert on them."""

from __future__ import annotations

from rlsched.runtime.audit import AuditEvent, AuditRecord


class MemorySink:
    """An :data:`~rlsched.runtime.audit.AuditSink` that keeps records in a list."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def __call__(self, record: AuditRecord) -> None:
        self.records.append(record)

    def events(self, event: AuditEvent | None = None) -> list[AuditRecord]:
        """Records of one kind (all when ``event`` is None)."""
        return [r for r in self.records if event is None or r.event is event]
