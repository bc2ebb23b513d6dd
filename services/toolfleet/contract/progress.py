"""What a change of an invocation's status view means as agent events (pure).

The SSE route and :class:`~toolfleet.client.http.HttpClient` both follow the status
projection; this is the one reading of it they share. Progress is reported from the
tool's checkpoints only, not from the phases the projection writes on the way
(``authorized``, ``awaiting_approval``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from toolfleet.contract.http import InvocationView
from toolfleet.events.models import InvocationStatus

__all__ = ["EventKind", "InvocationEvent", "view_events"]


class EventKind(StrEnum):
    """What happened to a call, for UIs."""

    TOOL_CALL_START = "tool_call_start"
    PROGRESS = "progress"
    APPROVAL_PENDING = "approval_pending"
    """The call waits for a human; the run goes on waiting for it, nothing failed."""
    TOOL_CALL_RESULT = "tool_call_result"


def view_events(before: InvocationView | None, now: InvocationView) -> list[EventKind]:
    """The events between two reads of one invocation (``before`` is None on the first)."""
    found: list[EventKind] = []
    if before is None:
        found.append(EventKind.TOOL_CALL_START)
    waiting = InvocationStatus.PENDING_APPROVAL
    if now.status is waiting and (before is None or before.status is not waiting):
        found.append(EventKind.APPROVAL_PENDING)
    previous = before.latest_checkpoint if before is not None else None
    if now.latest_checkpoint and now.latest_checkpoint != previous and not now.status.is_terminal:
        found.append(EventKind.PROGRESS)
    if now.status.is_terminal:
        found.append(EventKind.TOOL_CALL_RESULT)
    return found


class InvocationEvent(BaseModel):
    """One event of an invocation's life as a client's ``events`` yields it, the same over
    every transport: ``tool_call_start`` first, then any ``approval_pending`` and
    ``progress``, and ``tool_call_result`` last."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: EventKind
    invocation_id: str
    progress_percent: float | None = None
    """``progress`` only: the tool's last checkpoint's percentage."""
    current_phase: str = ""
    """``progress`` only: the tool's last checkpoint's phase."""
