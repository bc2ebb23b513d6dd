"""Request and response bodies of the HTTP API (pure pydantic, no I/O)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.contract.manifest import LifecycleState, ToolManifest
from toolfleet.errors import ErrorInfo
from toolfleet.events.models import DocumentAccess, ExecutionMetadata, InvocationStatus, ToolOutcome


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- invocations -----------------------------------------------------------------------


class PollingInfo(_Body):
    status_url: str
    """Where to ``GET`` the invocation's status."""
    poll_interval_ms: int = 500
    """A sensible delay between polls."""


class InvokeAccepted(_Body):
    """``202`` answer to ``POST /v1/invocations``: the request is on the bus."""

    invocation_id: str
    status: Literal["pending"] = "pending"
    polling_info: PollingInfo


class ApprovalView(_Body):
    """What an approver approves: present while the call is ``pending_approval``."""

    tool_id: str
    tool_version: str | None
    """The resolved version the call would run."""
    parameters: dict[str, Any] | None
    """The parameters, after audit sanitization (secrets and PII patterns masked)."""
    parameters_hash: str | None
    """SHA-256 of the canonical tool, version and (unsanitized) parameters: the approval
    binds to it, and ``POST .../approve`` sends it unless the body names one."""


class InvocationView(_Body):
    """One invocation as the status projection (``tool_invocations``) knows it."""

    invocation_id: UUID
    tenant_id: str
    agent_did: str | None = None
    """The requesting agent (an approver must be someone else)."""
    tool_id: str
    tool_version: str | None = None
    """The resolved version, once policy has resolved it."""
    status: InvocationStatus
    progress_percent: float = 0
    current_phase: str = ""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    """The outcome's error: ``code``, ``message``, ``details``, ``retryable``, ``retry_after_s``."""
    latest_checkpoint: dict[str, Any] | None = None
    execution_metadata: dict[str, Any] | None = None
    documents_accessed: list[DocumentAccess] = Field(default_factory=list)
    """The documents the call read, with the version each was pinned to."""
    warnings: list[str] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    approval: ApprovalView | None = None
    """While ``pending_approval``: tool, version, sanitized parameters and the hash the
    approval binds to."""
    trace_id: str | None = None
    """The invocation's W3C trace id: every event of the call, cancels and approvals
    included, carries it in ``traceparent``."""


class InvocationPage(_Body):
    """A page of invocations, newest first."""

    items: list[InvocationView]
    next_cursor: str | None = None
    """Pass as ``cursor`` to get the next page; ``null`` on the last page."""


class ControlBody(_Body):
    """Optional body of ``cancel``, ``approve`` and ``deny``."""

    reason: str = Field(default="", max_length=1024)
    """Why; recorded in the control event and the audit trail."""
    parameters_hash: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """``approve`` only: the ``parameters_hash`` of the request the approver reviewed; the
    approval then applies to that exact tool, version and parameters only."""


class CancelResult(_Body):
    invocation_id: str
    cancelled: bool
    """Whether a cancellation was requested (``false`` if the invocation had finished)."""
    message: str


class DecisionResult(_Body):
    invocation_id: str
    decision: Literal["approved", "denied"]
    message: str


# --- registry ------------------------------------------------------------------------


class VersionSummary(_Body):
    version: str
    lifecycle_state: LifecycleState
    """As of now: a deprecated version past its sunset date shows ``sunset``."""
    deprecated: bool
    """``true`` for deprecated and sunset versions (removed ones are not listed)."""
    effect: str
    requires_approval: bool = False
    deprecation_date: datetime | None = None
    sunset_date: datetime | None = None
    deprecated_in_favor_of: str | None = None


class ToolSummary(_Body):
    tool_id: str
    tool_name: str
    """The id without its namespace (``get_current_time`` of ``core__get_current_time``)."""
    description: str
    category: str
    tags: list[str]
    latest_version: str | None
    """The newest version that is not deprecated (else the newest listed)."""
    requires_approval: bool
    """Whether calls of ``latest_version`` always wait for an approver."""
    versions: list[VersionSummary]
    """Newest first; removed versions are left out."""
    score: float | None = None
    """With ``q``: relevance of the tool to the query, a blend of meaning (embeddings) and
    words (BM25 over name, description, tags, parameters and keywords); 1 is a perfect
    match."""
    low_relevance: bool = False
    """With ``q``: the score is low (under 0.2), a weak match at best. When no tool is a
    confident match, the best few come back, every one marked so."""


class ToolPage(_Body):
    items: list[ToolSummary]
    page: int
    page_size: int
    total: int


class ToolDetail(_Body):
    """A tool with the full manifest of every version but the removed ones, newest first."""

    tool_id: str
    tool_name: str
    description: str
    category: str
    tags: list[str]
    latest_version: str | None
    requires_approval: bool
    versions: list[ToolManifest]


class LifecyclePatch(_Body):
    """``PATCH /v1/tools/{id}/versions/{v}``: move a version along its lifecycle."""

    lifecycle_state: LifecycleState
    """``deprecated``, ``sunset`` or ``removed`` (never backwards)."""
    sunset_date: datetime | None = None
    """``deprecated``: the sunset date the warnings announce; ``sunset``: when it takes
    effect (default: now). Timezone-aware ISO 8601, after ``deprecation_date``."""
    deprecation_date: datetime | None = None
    """From when callers are warned (default: as already set, else now); until then the
    version stays active. Timezone-aware ISO 8601."""
    deprecated_in_favor_of: str | None = Field(default=None, max_length=200)
    """The successor: a version of this tool (``2.0.0``) or a tool (``acme__x@1.0.0``)."""
    message: str | None = Field(default=None, max_length=500)
    """Free text added to the warnings (no secrets: it is shown to every caller)."""


class LifecycleResult(_Body):
    tool_id: str
    version: str
    previous_state: LifecycleState
    lifecycle_state: LifecycleState
    """As of now (a ``sunset`` with a future date reads ``deprecated`` until then)."""
    deprecation_date: datetime | None
    sunset_date: datetime | None
    deprecated_in_favor_of: str | None
    changed_by: str


# --- health --------------------------------------------------------------------------


class Health(_Body):
    status: Literal["ok"] = "ok"


class Readiness(_Body):
    status: Literal["ok"] = "ok"
    checks: dict[str, str]
    """``ok`` per dependency (``kafka``, ``redis``, ``postgres``)."""


def view_outcome(view: InvocationView) -> ToolOutcome:
    """The outcome a terminal status view carries, as the results topic delivers it, so a
    client answers ``wait`` with one shape over every transport."""
    return ToolOutcome(
        invocation_id=view.invocation_id,
        status=view.status,
        agent_did=view.agent_did or "",
        tenant_id=view.tenant_id,
        tool_id=view.tool_id,
        tool_version=view.tool_version,
        result=view.result,
        error=ErrorInfo.model_validate(view.error) if view.error else None,
        warnings=view.warnings,
        execution_metadata=ExecutionMetadata.model_validate(view.execution_metadata or {}),
    )
