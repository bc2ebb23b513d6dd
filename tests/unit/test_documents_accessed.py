"""``documents_accessed`` reaches the status view and the audit record of an outcome."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.support.lifecycle import Lifecycle
from toolfleet.audit.records import audit_event
from toolfleet.events.envelope import Envelope
from toolfleet.status.projection import apply, fact_of

pytestmark = pytest.mark.unit

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ACCESSED = [{"document_id": "handbook", "version": "1", "access": "read"}]


def with_documents(event: Envelope) -> Envelope:
    return event.model_copy(update={"data": {**event.data, "documents_accessed": ACCESSED}})


def test_the_status_row_keeps_the_outcomes_documents() -> None:
    lc = Lifecycle()
    row = None
    for event in (lc.requested(at=0), with_documents(lc.outcome(at=6))):
        fact = fact_of(event, now=NOW)
        assert fact is not None
        row = apply(row, fact)
    assert row is not None
    assert list(row.documents_accessed) == ACCESSED


def test_the_audit_record_lists_the_documents_read() -> None:
    lc = Lifecycle()
    envelope = audit_event(with_documents(lc.outcome(at=6)), topic="t", now=NOW)
    unmapped = envelope.data["ocsf"]["unmapped"]
    assert unmapped["documents_accessed"] == ["handbook@1:read"]
