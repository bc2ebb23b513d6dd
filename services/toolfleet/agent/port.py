"""``FleetPort``: what the agent runner needs from the fleet, and its in-memory twin.

The runner submits invokes (each with its call id as idempotency key), awaits their
outcomes while hearing progress and approval requests, and reads the policy-filtered
catalog. :class:`MemoryFleet` plays the fleet for unit tests (tools are plain async
functions, idempotency keys and approvals behave as the fleet's do); the real fleet,
over either transport, is in :mod:`toolfleet.agent.fleets`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ApprovalDenied, ErrorInfo, ToolfleetError, ToolNotFound
from toolfleet.events.models import ExecutionMetadata, InvocationStatus, ToolOutcome

__all__ = [
    "FleetEvent",
    "FleetEventKind",
    "FleetPort",
    "MemoryFleet",
    "OnFleetEvent",
    "Submission",
    "Submitted",
]


@dataclass(frozen=True, kw_only=True)
class Submission:
    """One invoke the runner asks the fleet for."""

    tool_id: str
    tool_version: str
    parameters: dict[str, Any]
    idempotency_key: str
    """The call's deterministic id: a re-submission runs nothing and gets the first outcome."""
    session_id: str = ""
    """The run id, for the audit trail."""


@dataclass(frozen=True, kw_only=True)
class Submitted:
    """What submitting returned."""

    invocation_id: str
    trace_id: str | None = None


class FleetEventKind(StrEnum):
    INVOKED = "invoked"
    PROGRESS = "progress"
    APPROVAL_REQUESTED = "approval_requested"


@dataclass(frozen=True, kw_only=True)
class FleetEvent:
    """A non-terminal lifecycle event of one submitted invocation."""

    kind: FleetEventKind
    invocation_id: str
    progress_percent: float | None = None
    current_phase: str = ""


OnFleetEvent = Callable[[FleetEvent], None]


class FleetPort(Protocol):
    """The fleet as an agent run sees it."""

    async def catalog(self) -> list[ToolManifest]:
        """Manifests of the tools the run's token and its tenant's policy allow."""
        ...

    async def submit(self, submission: Submission) -> Submitted:
        """Publish one invoke; returns once the fleet has it."""
        ...

    async def outcome(
        self, submitted: Submitted, *, on_event: OnFleetEvent | None = None, timeout: float
    ) -> ToolOutcome:
        """The invocation's terminal outcome; ``on_event`` hears progress and approvals."""
        ...


ToolFunction = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class _Pending:
    outcome: asyncio.Future[ToolOutcome]
    events: list[FleetEvent] = field(default_factory=list)
    listeners: list[OnFleetEvent] = field(default_factory=list)

    def emit(self, event: FleetEvent) -> None:
        self.events.append(event)
        for listener in self.listeners:
            listener(event)


class MemoryFleet:
    """The fleet in a dict: tools run in-process, idempotency keys and approvals as real.

    ``runs`` counts each tool's real executions: a duplicate key runs nothing.
    """

    def __init__(self, *, tenant_id: str = "t1", agent_did: str = "did:agent:twin") -> None:
        self.tenant_id = tenant_id
        self.agent_did = agent_did
        self.manifests: list[ToolManifest] = []
        self.functions: dict[str, ToolFunction] = {}
        self.needs_approval: set[str] = set()
        self.runs: Counter[str] = Counter()
        self.submissions: list[Submission] = []
        self._pending: dict[str, _Pending] = {}
        self._keys: dict[str, str] = {}
        self._approvals: dict[str, asyncio.Future[bool]] = {}

    def add_tool(
        self, manifest: ToolManifest, function: ToolFunction, *, needs_approval: bool = False
    ) -> None:
        self.manifests.append(manifest)
        self.functions[manifest.tool_id] = function
        if needs_approval:
            self.needs_approval.add(manifest.tool_id)

    async def catalog(self) -> list[ToolManifest]:
        return list(self.manifests)

    async def submit(self, submission: Submission) -> Submitted:
        self.submissions.append(submission)
        invocation_id = str(uuid.uuid4())
        first = self._keys.get(submission.idempotency_key)
        if first is not None:
            owner = self._pending[first].outcome
            self._pending[invocation_id] = _Pending(outcome=self._duplicate(owner, invocation_id))
        else:
            self._keys[submission.idempotency_key] = invocation_id
            pending = _Pending(outcome=asyncio.get_running_loop().create_future())
            self._pending[invocation_id] = pending
            task = asyncio.create_task(self._run(invocation_id, submission, pending))
            task.add_done_callback(lambda t: pending.outcome.set_result(t.result()))
        return Submitted(invocation_id=invocation_id, trace_id=uuid.uuid4().hex)

    def approve(self, invocation_id: str, *, approved: bool = True) -> None:
        """Decide a call waiting for approval (as an approver would through the API)."""
        self._approvals[invocation_id].set_result(approved)

    def waiting_for_approval(self) -> list[str]:
        return [i for i, f in self._approvals.items() if not f.done()]

    async def outcome(
        self, submitted: Submitted, *, on_event: OnFleetEvent | None = None, timeout: float
    ) -> ToolOutcome:
        pending = self._pending[submitted.invocation_id]
        if on_event is not None:
            for event in pending.events:
                on_event(event)
            pending.listeners.append(on_event)
        async with asyncio.timeout(timeout):
            return await asyncio.shield(pending.outcome)

    def _duplicate(
        self, first: asyncio.Future[ToolOutcome], invocation_id: str
    ) -> asyncio.Future[ToolOutcome]:
        async def copy() -> ToolOutcome:
            outcome = await first
            return outcome.model_copy(update={"invocation_id": uuid.UUID(invocation_id)})

        return asyncio.ensure_future(copy())

    async def _run(self, invocation_id: str, sub: Submission, pending: _Pending) -> ToolOutcome:
        started = datetime.now(UTC)
        manifest = next((m for m in self.manifests if m.tool_id == sub.tool_id), None)
        try:
            if manifest is None:
                raise ToolNotFound(f"tool {sub.tool_id!r} is not registered")
            if sub.tool_id in self.needs_approval:
                decision = asyncio.get_running_loop().create_future()
                self._approvals[invocation_id] = decision
                pending.emit(
                    FleetEvent(kind=FleetEventKind.APPROVAL_REQUESTED, invocation_id=invocation_id)
                )
                if not await decision:
                    raise ApprovalDenied("the call was denied")
            pending.emit(FleetEvent(kind=FleetEventKind.INVOKED, invocation_id=invocation_id))
            self.runs[sub.tool_id] += 1
            result = await self.functions[sub.tool_id](sub.parameters)
        except ToolfleetError as exc:
            return self._outcome(invocation_id, sub, started, error=exc.to_error_info())
        return self._outcome(invocation_id, sub, started, result=result, manifest=manifest)

    def _outcome(
        self,
        invocation_id: str,
        sub: Submission,
        started: datetime,
        *,
        result: dict[str, Any] | None = None,
        error: ErrorInfo | None = None,
        manifest: ToolManifest | None = None,
    ) -> ToolOutcome:
        status = InvocationStatus.SUCCESS
        if error is not None:
            status = (
                InvocationStatus.PERMISSION_DENIED
                if error.code.value == "permission_denied"
                else InvocationStatus.ERROR
            )
        ended = datetime.now(UTC)
        return ToolOutcome(
            invocation_id=uuid.UUID(invocation_id),
            status=status,
            agent_did=self.agent_did,
            tenant_id=self.tenant_id,
            tool_id=sub.tool_id,
            tool_version=manifest.version if manifest else None,
            result=result,
            error=error,
            execution_metadata=ExecutionMetadata(
                duration_ms=int((ended - started).total_seconds() * 1000),
                started_at=started,
                completed_at=ended,
            ),
        )


if TYPE_CHECKING:

    def _implements_the_port(fleet: MemoryFleet) -> FleetPort:
        return fleet  # mypy checks the twin against the port
