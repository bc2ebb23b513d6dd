"""The call page's timeline wording: denials and calls that never ran."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from toolfleet.api.console.timeline import TimelineMark, timeline
from toolfleet.contract.http import InvocationView
from toolfleet.events.models import InvocationStatus

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_a_denial_reads_as_a_denial_with_no_attempt() -> None:
    view = InvocationView(
        invocation_id=uuid.UUID(int=7),
        tenant_id="t1",
        tool_id="core__echo",
        status=InvocationStatus.PERMISSION_DENIED,
        created_at=T0,
        updated_at=T0,
        completed_at=T0 + timedelta(milliseconds=20),
        error={"code": "permission_denied", "message": "no grant"},
        execution_metadata={"attempts": 1},
    )
    marks = [
        TimelineMark(kind="requested", at=T0),
        TimelineMark(
            kind="terminal",
            at=T0 + timedelta(milliseconds=20),
            detail={"status": "permission_denied", "error_code": "permission_denied"},
        ),
    ]
    t = timeline(view, marks)
    assert t.steps[-1].label == "denied"
    assert t.attempts == 0


def test_an_error_code_equal_to_the_status_is_said_once() -> None:
    view = InvocationView(
        invocation_id=uuid.UUID(int=8),
        tenant_id="t1",
        tool_id="core__echo",
        status=InvocationStatus.TIMEOUT,
        created_at=T0,
        updated_at=T0,
        started_at=T0,
        completed_at=T0 + timedelta(seconds=1),
    )
    marks = [
        TimelineMark(kind="invoked", at=T0, detail={"attempt": 1}),
        TimelineMark(
            kind="terminal",
            at=T0 + timedelta(seconds=1),
            detail={"status": "timeout", "error_code": "timeout"},
        ),
    ]
    t = timeline(view, marks)
    assert t.steps[-1].label == "outcome timeout"
    assert t.attempts == 1
