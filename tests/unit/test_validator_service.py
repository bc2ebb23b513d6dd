"""``ValidatorService`` on in-memory twins: what a client gets for each executed result."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ErrorCode
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.large_results import encode_result
from toolfleet.events.models import (
    AgentContext,
    Effect,
    ExecutionMetadata,
    InvocationStatus,
    InvokeExecuted,
    ResultBlob,
    ToolOutcome,
)
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.registry.lookup import MemoryManifests, ToolLookup
from toolfleet.registry.redaction import REDACTED
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.storage.blobs import MemoryBlobStore
from toolfleet.validator.service import ValidatorService

pytestmark = pytest.mark.unit

TENANT = "tenant_acme"
AGENT = "did:agent:reader"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

LOOKUP_USER = ToolManifest(
    tool_id="crm__lookup_user",
    version="1.2.0",
    effect=Effect.READ_ONLY,
    input_schema={"type": "object"},
    output_schema={
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "email": {"type": "string"},
            "rows": {"type": "array"},
        },
        "required": ["name"],
    },
    redaction_allowlist=["name", "rows"],
    timeout_seconds=5,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def blobs(clock: Clock) -> MemoryBlobStore:
    return MemoryBlobStore(clock=clock)


def _service(blobs: MemoryBlobStore | None, *, inline_bytes: int = 4096) -> ValidatorService:
    return ValidatorService(
        lookup=ToolLookup(MemoryManifests([LOOKUP_USER])),
        schemas=CompiledSchemas(),
        blobs=blobs,
        inline_bytes=inline_bytes,
        attachment_ttl_s=3600,
    )


def _executed(
    result: dict[str, Any],
    *,
    blob: ResultBlob | None = None,
    version: str = "1.2.0",
    invocation_id: uuid.UUID | None = None,
) -> Envelope:
    invocation = invocation_id or uuid.uuid4()
    data = InvokeExecuted(
        invocation_id=invocation,
        tool_id="crm__lookup_user",
        tool_version=version,
        agent_context=AgentContext(agent_did=AGENT, tenant_id=TENANT),
        result=result,
        result_blob=blob,
        warnings=["1.2.0 is deprecated"],
        execution_metadata=ExecutionMetadata(duration_ms=12, started_at=NOW, completed_at=NOW),
    )
    return new_event(
        event_type=EventType.INVOKE_EXECUTED,
        source=Source.EXECUTOR,
        data=data,
        tenant_id=TENANT,
        invocation_id=str(invocation),
    )


async def _outcome(service: ValidatorService, event: Envelope) -> tuple[Envelope, ToolOutcome]:
    emitted = await service.on_executed(event)
    assert len(emitted) == 1
    topic, envelope = emitted[0]
    assert topic is TopicName.RESULTS
    assert envelope.source == Source.VALIDATOR
    assert envelope.invocationid == event.invocationid
    assert envelope.tenantid == TENANT
    return envelope, envelope.data_as(ToolOutcome)


async def test_a_valid_result_succeeds_with_the_fields_the_tool_allows(
    blobs: MemoryBlobStore,
) -> None:
    event = _executed({"name": "Ada", "email": "ada@example.com", "rows": [{"id": 1}]})
    envelope, outcome = await _outcome(_service(blobs), event)
    assert envelope.type == EventType.SUCCEEDED
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"name": "Ada", "email": REDACTED, "rows": [{"id": 1}]}
    assert (outcome.tool_id, outcome.tool_version) == ("crm__lookup_user", "1.2.0")
    assert (outcome.tenant_id, outcome.agent_did) == (TENANT, AGENT)
    assert outcome.warnings == ["1.2.0 is deprecated"]
    assert outcome.execution_metadata.duration_ms == 12
    assert not outcome.execution_metadata.truncated
    assert len(blobs) == 0


async def test_a_result_off_its_schema_fails_without_quoting_the_value(
    blobs: MemoryBlobStore,
) -> None:
    event = _executed({"name": 42, "email": "ada@example.com"})
    envelope, outcome = await _outcome(_service(blobs), event)
    assert envelope.type == EventType.FAILED
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.result is None
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.RESULT_VALIDATION_FAILED
    assert not outcome.error.retryable
    [error] = outcome.error.details["errors"]
    assert (error["field"], error["keyword"]) == ("name", "type")
    assert "42" not in json.dumps(outcome.error.model_dump(mode="json"))
    assert outcome.warnings == ["1.2.0 is deprecated"]


async def test_a_missing_required_field_names_the_field(blobs: MemoryBlobStore) -> None:
    _, outcome = await _outcome(_service(blobs), _executed({"email": "ada@example.com"}))
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.RESULT_VALIDATION_FAILED
    assert "name" in outcome.error.details["errors"][0]["message"]


async def test_an_unregistered_version_fails_as_not_found(blobs: MemoryBlobStore) -> None:
    _, outcome = await _outcome(_service(blobs), _executed({"name": "Ada"}, version="9.0.0"))
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.TOOL_NOT_FOUND


async def test_a_result_nested_too_deeply_fails_as_too_large(
    blobs: MemoryBlobStore,
) -> None:
    # Only a transfer blob carries it: an event this deep does not serialize.
    invocation = uuid.uuid4()
    depth = 300
    raw = ('{"name":"Ada","email":' + '{"x":' * depth + "1" + "}" * depth + "}").encode()
    blob_id = await blobs.put(
        raw, tenant_id=TENANT, invocation_id=str(invocation), purpose="transfer"
    )
    event = _executed(
        {}, blob=ResultBlob(blob_id=blob_id, bytes=len(raw)), invocation_id=invocation
    )
    envelope, outcome = await _outcome(_service(blobs), event)
    assert envelope.type == EventType.FAILED
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.RESULT_TOO_LARGE
    assert not outcome.error.retryable
    assert outcome.error.details == {"limit": "depth", "max": 64}
    assert "nested too deeply" in outcome.error.message


async def test_a_large_result_becomes_a_preview_with_its_whole_as_an_attachment(
    blobs: MemoryBlobStore, clock: Clock
) -> None:
    rows = [{"id": i, "note": "n" * 100} for i in range(200)]
    event = _executed({"name": "Ada", "email": "ada@example.com", "rows": rows})
    service = _service(blobs, inline_bytes=2048)
    _, outcome = await _outcome(service, event)
    assert outcome.status is InvocationStatus.SUCCESS
    metadata = outcome.execution_metadata
    assert metadata.truncated
    assert outcome.result is not None
    assert len(encode_result(outcome.result)) <= 2048
    assert outcome.result["name"] == "Ada"
    assert 0 < len(outcome.result["rows"]) < 200
    [attachment] = metadata.attachments
    prefix = f"/v1/invocations/{event.invocationid}/attachments/"
    assert attachment.url.startswith(prefix)
    blob_id = attachment.url.removeprefix(prefix)
    stored = await blobs.get(
        blob_id, purpose="attachment", tenant_id=TENANT, invocation_id=event.invocationid
    )
    assert stored is not None
    assert attachment.bytes == len(stored.data)
    # The attachment holds the redacted whole, never the raw result.
    assert json.loads(stored.data) == {"name": "Ada", "email": REDACTED, "rows": rows}
    assert await blobs.get(blob_id, purpose="attachment", tenant_id="tenant_other") is None

    # A redelivered event finds its attachment stored: one blob, the same link.
    _, again = await _outcome(service, event)
    assert again.execution_metadata.attachments == [attachment]
    assert len(blobs) == 1

    clock.now += 3600
    assert await blobs.get(blob_id, purpose="attachment", tenant_id=TENANT) is None


async def test_without_a_blob_store_a_large_result_travels_whole(
    blobs: MemoryBlobStore,
) -> None:
    rows = [{"id": i, "note": "n" * 100} for i in range(200)]
    _, outcome = await _outcome(
        _service(None, inline_bytes=2048), _executed({"name": "Ada", "rows": rows})
    )
    assert outcome.result == {"name": "Ada", "rows": rows}
    assert not outcome.execution_metadata.truncated


async def test_a_result_sent_as_a_transfer_blob_is_read_back_and_validated(
    blobs: MemoryBlobStore,
) -> None:
    invocation = uuid.uuid4()
    raw = encode_result({"name": "Ada", "email": "ada@example.com"})
    blob_id = await blobs.put(
        raw, tenant_id=TENANT, invocation_id=str(invocation), purpose="transfer"
    )
    event = _executed(
        {}, blob=ResultBlob(blob_id=blob_id, bytes=len(raw)), invocation_id=invocation
    )
    _, outcome = await _outcome(_service(blobs), event)
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"name": "Ada", "email": REDACTED}


async def test_a_transfer_blob_the_store_no_longer_holds_fails_as_internal_error(
    blobs: MemoryBlobStore,
) -> None:
    gone = str(uuid.uuid4())
    event = _executed({}, blob=ResultBlob(blob_id=gone, bytes=300_000))
    envelope, outcome = await _outcome(_service(blobs), event)
    assert envelope.type == EventType.FAILED
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.INTERNAL_ERROR
    assert outcome.error.details == {"blob_id": gone}
    assert "300000-byte result" in outcome.error.message


async def test_a_transfer_blob_of_another_tenant_reads_as_missing(
    blobs: MemoryBlobStore,
) -> None:
    invocation = uuid.uuid4()
    raw = encode_result({"name": "Ada"})
    blob_id = await blobs.put(
        raw, tenant_id="tenant_other", invocation_id=str(invocation), purpose="transfer"
    )
    event = _executed(
        {}, blob=ResultBlob(blob_id=blob_id, bytes=len(raw)), invocation_id=invocation
    )
    _, outcome = await _outcome(_service(blobs), event)
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.INTERNAL_ERROR


async def test_a_transfer_blob_that_is_not_a_json_object_fails_as_internal_error(
    blobs: MemoryBlobStore,
) -> None:
    invocation = uuid.uuid4()
    blob_id = await blobs.put(
        b"[1, 2", tenant_id=TENANT, invocation_id=str(invocation), purpose="transfer"
    )
    event = _executed({}, blob=ResultBlob(blob_id=blob_id, bytes=5), invocation_id=invocation)
    _, outcome = await _outcome(_service(blobs), event)
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.INTERNAL_ERROR
    assert "not a JSON object" in outcome.error.message


async def test_a_blob_store_that_does_not_answer_is_waited_out_not_failed(
    blobs: MemoryBlobStore,
) -> None:
    """An outage is no fault of the result: the error reaches the consumer runtime, which
    retries the record (connection errors are transient); no outcome is emitted until the
    store answers, then the redelivery succeeds with one attachment."""
    rows = [{"id": i, "note": "n" * 100} for i in range(200)]
    event = _executed({"name": "Ada", "rows": rows})
    service = _service(blobs, inline_bytes=2048)
    blobs.outage = ConnectionRefusedError("connection refused")
    with pytest.raises(ConnectionRefusedError):
        await service.on_executed(event)
    assert len(blobs) == 0
    blobs.outage = None
    _, outcome = await _outcome(service, event)
    assert outcome.status is InvocationStatus.SUCCESS
    assert len(outcome.execution_metadata.attachments) == 1
    assert len(blobs) == 1
