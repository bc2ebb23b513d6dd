"""One invocation's timeline, from the status projection (pure: no I/O).

The projection keeps, beside each dedupe marker, what the event said (migration 0009):
requested, authorized (its executor pool, outside ``default``), queued (the pool it
waits for), approval requested/granted/denied, invoked (attempt, worker, resumed
checkpoint), checkpoints, executed, cancel requested, outcome. :func:`timeline`
orders them and adds durations, attempts, resumes and worker hand-overs. What the
markers no longer tell (pruned after ``TOOLFLEET_DEDUPE_TTL_S``, or projected before
0009) comes from the invocation row: its creation, start, checkpoints and outcome.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from toolfleet.contract.http import InvocationView

#: Display order of kinds that share a timestamp.
_ORDER = {
    "requested": 0,
    "approval_requested": 1,
    "approval_granted": 2,
    "approval_denied": 2,
    "authorized": 3,
    "queued": 4,
    "invoked": 5,
    "checkpoint": 6,
    "executed": 7,
    "cancel_requested": 8,
    "terminal": 9,
}
_LABELS = {
    "requested": "requested",
    "approval_requested": "approval requested",
    "approval_granted": "approved",
    "approval_denied": "denied",
    "authorized": "authorized",
    "queued": "queued",
    "invoked": "invoked",
    "checkpoint": "checkpoint",
    "executed": "executed",
    "cancel_requested": "cancel requested",
    "terminal": "outcome",
}


@dataclass(frozen=True, kw_only=True)
class TimelineMark:
    """What one projected event said (a ``projected_events`` row with a kind)."""

    kind: str
    at: datetime
    source: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TimelineStep(_Body):
    kind: str
    """``requested``, ``authorized``, ``invoked``, ``checkpoint``, ``terminal``, ..."""
    label: str
    """What the console shows, e.g. ``invoked (attempt 2, resumed)``."""
    at: datetime
    since_start_ms: int
    """Milliseconds since the call was requested."""
    since_previous_ms: int
    """Milliseconds since the step before (the duration of that phase)."""
    detail: dict[str, Any]
    """Attempt and worker of ``invoked``; checkpoint id, progress and phase; outcome."""


class Timeline(_Body):
    """``GET /v1/invocations/{id}/timeline``."""

    invocation_id: str
    tenant_id: str
    tool_id: str
    status: str
    duration_ms: int | None
    """Requested to outcome; ``null`` while the call runs."""
    attempts: int
    resumes: int
    """Attempts that resumed from a checkpoint."""
    handovers: int
    """Times the call moved to another worker (an attempt on a new ``worker_id``)."""
    steps: list[TimelineStep]


def _from_row(view: InvocationView, marks: list[TimelineMark]) -> list[TimelineMark]:
    """Marks the row implies that no projected event recorded any more."""
    have = {m.kind for m in marks}
    meta = view.execution_metadata or {}
    implied: list[TimelineMark] = []
    if "requested" not in have:
        implied.append(TimelineMark(kind="requested", at=view.created_at))
    if "invoked" not in have and view.started_at is not None:
        detail: dict[str, Any] = {"attempt": meta.get("attempts", 1)}
        if meta.get("resumed_from_checkpoint_id"):
            detail["resumed_from_checkpoint_id"] = meta["resumed_from_checkpoint_id"]
        implied.append(TimelineMark(kind="invoked", at=view.started_at, detail=detail))
    if "checkpoint" not in have:
        for ref in meta.get("checkpoints_created") or []:
            at = _parse(ref.get("timestamp"))
            if at is not None:
                detail = {"checkpoint_id": ref.get("checkpoint_id")}
                detail["checkpoint_type"] = ref.get("checkpoint_type")
                implied.append(TimelineMark(kind="checkpoint", at=at, detail=detail))
    if "terminal" not in have and view.status.is_terminal:
        detail = {"status": view.status.value}
        if view.error:
            detail["error_code"] = view.error.get("code")
        implied.append(
            TimelineMark(kind="terminal", at=view.completed_at or view.updated_at, detail=detail)
        )
    return implied


def _parse(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _label(mark: TimelineMark, attempt_workers: list[str | None]) -> str:
    d = mark.detail
    label = _LABELS.get(mark.kind, mark.kind)
    if mark.kind == "invoked":
        parts = [f"attempt {d.get('attempt', len(attempt_workers))}"]
        if d.get("resumed_from_checkpoint_id"):
            parts.append("resumed")
        if len(attempt_workers) > 1 and attempt_workers[-1] != attempt_workers[-2]:
            parts.append("new worker")
        return f"{label} ({', '.join(parts)})"
    if mark.kind == "checkpoint" and "progress_percent" in d:
        phase = f" {d['current_phase']}" if d.get("current_phase") else ""
        return f"{label} {float(d['progress_percent']):.0f}%{phase}"
    if mark.kind in {"authorized", "queued"} and d.get("pool"):
        return f"{label} (pool {d['pool']})"
    if mark.kind == "terminal":
        status = str(d.get("status", ""))
        if status == "permission_denied":
            # A refusal is not a run that failed: say so, once.
            return "denied"
        code = f": {d['error_code']}" if d.get("error_code") and d["error_code"] != status else ""
        return f"{label} {status}{code}".rstrip()
    return label


def _ms(later: datetime, earlier: datetime) -> int:
    return max(0, round((later - earlier).total_seconds() * 1000))


def timeline(view: InvocationView, marks: list[TimelineMark]) -> Timeline:
    """The ordered steps of ``view``'s life, with durations and counts."""
    known = [m for m in marks if m.kind in _ORDER]
    every = sorted([*known, *_from_row(view, known)], key=lambda m: (m.at, _ORDER[m.kind]))
    start = every[0].at if every else view.created_at
    steps: list[TimelineStep] = []
    workers: list[str | None] = []
    previous = start
    for mark in every:
        if mark.kind == "invoked":
            workers.append(mark.detail.get("worker_id"))
        steps.append(
            TimelineStep(
                kind=mark.kind,
                label=_label(mark, workers),
                at=mark.at,
                since_start_ms=_ms(mark.at, start),
                since_previous_ms=_ms(mark.at, previous),
                detail=mark.detail,
            )
        )
        previous = mark.at
    invoked = [m for m in every if m.kind == "invoked"]
    meta_attempts = (view.execution_metadata or {}).get("attempts")
    # A call that never reached an executor (denied, cancelled while queued) made no attempt.
    attempts = (
        max(
            [len(invoked), *(int(m.detail.get("attempt") or 1) for m in invoked)]
            + ([int(meta_attempts)] if isinstance(meta_attempts, int) else [])
        )
        if invoked
        else 0
    )
    known_workers = [w for w in workers if w]
    handovers = sum(1 for a, b in itertools.pairwise(known_workers) if a != b)
    ended = next((m.at for m in reversed(every) if m.kind == "terminal"), None)
    return Timeline(
        invocation_id=str(view.invocation_id),
        tenant_id=view.tenant_id,
        tool_id=view.tool_id,
        status=view.status.value,
        duration_ms=_ms(ended, start) if ended is not None else None,
        attempts=attempts,
        resumes=sum(1 for m in invoked if m.detail.get("resumed_from_checkpoint_id")),
        handovers=handovers,
        steps=steps,
    )
