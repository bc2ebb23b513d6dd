"""Validates an executed result and turns it into the terminal outcome.

The tool's result rules run first (:mod:`toolfleet.results.checks`: limits, coercion in
``coerce`` mode, the output schema and allowlist, sanitization); each failure is its own
error code and what they changed is added to the outcome's ``warnings``.

A result too large for an event arrives as a transfer blob and is read back first; a
redacted result still larger than ``TOOLFLEET_RESULT_INLINE_BYTES`` is stored whole as a
blob attachment and the outcome carries a preview, with ``truncated`` set
(:mod:`toolfleet.events.large_results`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from toolfleet.errors import ToolfleetError
from toolfleet.events.envelope import Emitted, Envelope
from toolfleet.events.identity import CallRef
from toolfleet.events.large_results import attachment_url, encode_result, preview
from toolfleet.events.models import (
    Attachment,
    ExecutionMetadata,
    InvocationStatus,
    InvokeExecuted,
    ToolOutcome,
)
from toolfleet.events.outcomes import failure_event, outcome_event
from toolfleet.events.types import Source, TopicName
from toolfleet.registry.lookup import ToolLookup
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.results.checks import ResultChecker
from toolfleet.storage.blobs import ResultBlobs

#: Namespace of attachment ids, derived from the ``executed`` event they come from.
_ATTACHMENTS = uuid.UUID("6f1d3c52-9a1e-4f57-b1d4-2c8e7a9b0f31")


@dataclass(kw_only=True)
class ValidatorService:
    lookup: ToolLookup
    schemas: CompiledSchemas
    blobs: ResultBlobs | None = None
    """Large results: transfer blobs read, attachments written (None: every result inline)."""
    inline_bytes: int = 262_144
    attachment_ttl_s: int = 0
    """How long an attachment stays downloadable (0: until deleted)."""
    checker: ResultChecker = field(init=False)

    def __post_init__(self) -> None:
        self.checker = ResultChecker(self.schemas)

    async def on_executed(self, event: Envelope) -> list[Emitted]:
        executed = event.data_as(InvokeExecuted)
        try:
            manifest = await self.lookup.exact(executed.tool_id, executed.tool_version)
            full = await self._full_result(executed)
            checked = self.checker.check(manifest, full)
            result, metadata = await self._fit(event, executed, checked.result)
        except ToolfleetError as exc:
            return [
                (
                    TopicName.RESULTS,
                    failure_event(
                        event,
                        Source.VALIDATOR,
                        exc,
                        call=CallRef.of(executed, trace=event.traceparent),
                        warnings=executed.warnings,
                        execution_metadata=executed.execution_metadata,
                        documents_accessed=executed.documents_accessed,
                    ),
                )
            ]
        outcome = ToolOutcome(
            invocation_id=executed.invocation_id,
            status=InvocationStatus.SUCCESS,
            agent_did=executed.agent_context.agent_did,
            tenant_id=executed.agent_context.tenant_id,
            tool_id=executed.tool_id,
            tool_version=executed.tool_version,
            result=result,
            warnings=[*executed.warnings, *checked.warnings],
            execution_metadata=metadata,
            checkpoint_ref=executed.checkpoint_ref,
            documents_accessed=executed.documents_accessed,
        )
        return [(TopicName.RESULTS, outcome_event(event, Source.VALIDATOR, outcome))]

    async def _full_result(self, executed: InvokeExecuted) -> dict[str, Any]:
        """The result as the tool returned it, read back from its blob if it has one."""
        ref = executed.result_blob
        if ref is None:
            return executed.result
        blob = None
        if self.blobs is not None:
            blob = await self.blobs.get(
                ref.blob_id,
                purpose="transfer",
                tenant_id=executed.agent_context.tenant_id,
                invocation_id=str(executed.invocation_id),
            )
        if blob is None:
            raise ToolfleetError(
                f"the {ref.bytes}-byte result of {executed.tool_id} is no longer stored",
                details={"blob_id": ref.blob_id},
            )
        try:
            full = json.loads(blob.data)
        except ValueError:
            full = None
        if not isinstance(full, dict):
            raise ToolfleetError(f"the stored result of {executed.tool_id} is not a JSON object")
        return full

    async def _fit(
        self, event: Envelope, executed: InvokeExecuted, result: dict[str, Any]
    ) -> tuple[dict[str, Any], ExecutionMetadata]:
        """The result inline, or its preview plus the whole of it as an attachment."""
        metadata = executed.execution_metadata
        encoded = encode_result(result)
        if len(encoded) <= self.inline_bytes or self.blobs is None:
            return result, metadata
        invocation_id = str(executed.invocation_id)
        # Derived from the event: a redelivery finds its attachment already stored.
        blob_id = await self.blobs.put(
            encoded,
            tenant_id=executed.agent_context.tenant_id,
            invocation_id=invocation_id,
            purpose="attachment",
            ttl_s=self.attachment_ttl_s or None,
            blob_id=str(uuid.uuid5(_ATTACHMENTS, f"{event.source}/{event.id}")),
        )
        attachment = Attachment(
            url=attachment_url(invocation_id, blob_id),
            content_type="application/json",
            bytes=len(encoded),
        )
        metadata = metadata.model_copy(
            update={"truncated": True, "attachments": [*metadata.attachments, attachment]}
        )
        return preview(result, self.inline_bytes), metadata
