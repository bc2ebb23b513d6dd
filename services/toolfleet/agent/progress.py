"""What a change of an invocation's status view means as agent events (pure).

The SSE route and :class:`~toolfleet.agent.fleets.HttpFleet` both follow the status
projection; this is the one reading of it they share. Progress is reported from the
tool's checkpoints only, not from the phases the projection writes on the way
(``authorized``, ``awaiting_approval``).
"""

from __future__ import annotations

from toolfleet.agent.records import EventKind
from toolfleet.api.models import InvocationView
from toolfleet.events.models import InvocationStatus

__all__ = ["view_events"]


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
