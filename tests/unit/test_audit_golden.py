"""Audit output pinned byte for byte (``tests/golden/audit/events.json``).

The golden file was written by the audit implementation before its per-record cost was
cut; any drift in what audit emits (key, headers, value) for those events fails here.
Regenerate with ``python -m tests.support.audit_golden`` only after a deliberate change.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.audit_golden import GOLDEN, NOW, TOPIC, all_cases, rendered
from toolfleet.audit.records import audit_event
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import AuditRecord

pytestmark = pytest.mark.unit

PINNED: dict[str, dict[str, Any]] = json.loads(GOLDEN.read_text(encoding="utf-8"))
CASES = all_cases()


def test_every_case_is_pinned() -> None:
    assert sorted(CASES) == sorted(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_audit_event_matches_its_golden_bytes(name: str) -> None:
    before = datetime.now(UTC)
    audit = audit_event(CASES[name], topic=TOPIC, now=NOW)
    assert audit.time is not None
    assert before <= audit.time <= datetime.now(UTC)  # stamped when emitted
    assert rendered(audit) == PINNED[name]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_audit_event_is_a_valid_envelope_and_record(name: str) -> None:
    audit = audit_event(CASES[name], topic=TOPIC, now=NOW)
    assert Envelope.model_validate(audit.model_dump()) == audit
    record = AuditRecord.model_validate(audit.data)
    assert record.model_dump(mode="json") == audit.data
