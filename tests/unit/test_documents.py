"""ctx.documents on its in-memory twins: access, version pins, cache and invalidation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.support.eventually import eventually
from tests.support.sample_tools import read_document
from toolfleet.documents.cache import DocumentCache, MemoryCacheStore
from toolfleet.documents.pins import MemoryDocumentPins, MemoryPinBook
from toolfleet.documents.reader import CallDocuments
from toolfleet.documents.source import MemoryDocumentSource
from toolfleet.errors import (
    DocumentAccessDenied,
    DocumentNotFound,
    DocumentSourceUnavailable,
    ErrorCode,
    ErrorInfo,
    error_from,
)
from toolfleet.events.identity import CallKey
from toolfleet.events.models import DocumentContext, InvokeRequested
from toolfleet.sdk.testing import context_for, run_tool
from toolfleet.tools.context import ToolContext

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def named(*ids: str, **pins: str) -> DocumentContext:
    return DocumentContext.model_validate(
        {"documents": [{"document_id": i, "version": pins.get(i)} for i in ids]}
    )


@pytest.fixture
def source() -> MemoryDocumentSource:
    src = MemoryDocumentSource()
    src.put("handbook", "rules, first edition", title="Handbook")
    src.put("faq", "questions and answers", title="FAQ")
    return src


async def test_first_read_pins_the_version_for_the_rest_of_the_call_and_its_resume(
    source: MemoryDocumentSource,
) -> None:
    book = MemoryPinBook()
    run = CallDocuments(context=named("handbook"), source=source, pins=book(_call("inv-1")))
    assert (await run.get("handbook")).version == "1"

    source.put("handbook", "rules, second edition")
    assert (await run.get("handbook")).content == "rules, first edition"
    # The executor died; another run of the same invocation reads the same pins.
    resumed = CallDocuments(context=named("handbook"), source=source, pins=book(_call("inv-1")))
    doc = await resumed.get("handbook")
    assert (doc.version, doc.content) == ("1", "rules, first edition")
    # Another call reads what is current.
    other = CallDocuments(context=named("handbook"), source=source, pins=book(_call("inv-2")))
    assert (await other.get("handbook")).version == "2"


async def test_a_version_named_in_the_request_is_the_pin(source: MemoryDocumentSource) -> None:
    source.put("handbook", "rules, second edition")
    docs = CallDocuments(
        context=named("handbook", handbook="1"), source=source, pins=MemoryPinBook()(_call("i"))
    )
    assert (await docs.get("handbook")).content == "rules, first edition"
    assert [a.model_dump() for a in docs.accessed] == [
        {"document_id": "handbook", "version": "1", "access": "read"}
    ]


async def test_a_pinned_version_the_source_lost_is_not_found(source: MemoryDocumentSource) -> None:
    docs = CallDocuments(
        context=named("handbook", handbook="7"), source=source, pins=MemoryPinBook()(_call("i"))
    )
    with pytest.raises(DocumentNotFound):
        await docs.get("handbook")


async def test_only_documents_the_request_names_can_be_read(source: MemoryDocumentSource) -> None:
    docs = CallDocuments(context=named("faq"), source=source, pins=MemoryPinBook()(_call("i")))
    with pytest.raises(DocumentAccessDenied) as denied:
        await docs.get("handbook")
    assert denied.value.to_error_info().code is ErrorCode.DOCUMENT_ACCESS_DENIED
    with pytest.raises(DocumentAccessDenied):
        await docs.metadata("handbook")
    # Search finds both; the tool sees only the one it may read.
    hits = await docs.search("and")
    assert [h.document_id for h in hits] == ["faq"]
    assert docs.accessed[0].access == "search"


async def test_without_document_context_nothing_can_be_read(source: MemoryDocumentSource) -> None:
    docs = CallDocuments(context=None, source=source, pins=MemoryPinBook()(_call("i")))
    with pytest.raises(DocumentAccessDenied):
        await docs.get("handbook")
    assert await docs.search("rules") == []
    bare = ToolContext(
        tenant_id="t", agent_did="a", invocation_id="i", tool_id="x__y", tool_version="1"
    )
    with pytest.raises(DocumentAccessDenied):
        await bare.documents.get("handbook")


async def test_no_source_or_another_source_is_unavailable_and_retryable() -> None:
    docs = CallDocuments(context=named("handbook"), source=None, pins=MemoryPinBook()(_call("i")))
    with pytest.raises(DocumentSourceUnavailable) as exc:
        await docs.get("handbook")
    assert exc.value.to_error_info().retryable
    elsewhere = DocumentContext.model_validate(
        {"documents": [{"document_id": "handbook"}], "source": "wiki"}
    )
    docs = CallDocuments(
        context=elsewhere, source=MemoryDocumentSource(), pins=MemoryPinBook()(_call("i"))
    )
    with pytest.raises(DocumentSourceUnavailable, match="wiki"):
        await docs.get("handbook")


async def test_accesses_are_listed_once_per_document_and_kind(
    source: MemoryDocumentSource,
) -> None:
    docs = CallDocuments(
        context=named("handbook", "faq"), source=source, pins=MemoryPinBook()(_call("i"))
    )
    await docs.get("handbook")
    await docs.get("handbook")
    await docs.metadata("faq")
    assert [(a.document_id, a.version, a.access) for a in docs.accessed] == [
        ("handbook", "1", "read"),
        ("faq", "1", "metadata"),
    ]


async def test_cache_serves_reads_until_ttl_or_invalidation(source: MemoryDocumentSource) -> None:
    clock = Clock()
    cache = DocumentCache(MemoryCacheStore(clock=clock), source="default", ttl_s=300)
    book = MemoryPinBook()
    cache.after_subscribe()
    await eventually(lambda: _true(cache.trusted))

    first = CallDocuments(
        context=named("handbook"), source=source, pins=book(_call("a")), cache=cache
    )
    await first.metadata("handbook")
    await first.get("handbook")
    calls = source.calls
    # Another call within the TTL: metadata and content both come from the cache.
    second = CallDocuments(
        context=named("handbook"), source=source, pins=book(_call("b")), cache=cache
    )
    assert (await second.get("handbook")).version == "1"
    assert source.calls == calls

    # The document changes and the writer publishes its id: the next call sees version 2.
    source.put("handbook", "rules, second edition")
    await cache.invalidate("handbook")
    third = CallDocuments(
        context=named("handbook"), source=source, pins=book(_call("c")), cache=cache
    )
    assert (await third.get("handbook")).version == "2"
    assert source.calls > calls

    # A change nobody announced is seen once the TTL has run out.
    await third.metadata("handbook")
    source.put("handbook", "rules, third edition")
    fourth = CallDocuments(
        context=named("handbook"), source=source, pins=book(_call("d")), cache=cache
    )
    assert (await fourth.get("handbook")).version == "2"
    clock.now += 301
    fifth = CallDocuments(
        context=named("handbook"), source=source, pins=book(_call("e")), cache=cache
    )
    assert (await fifth.get("handbook")).version == "3"


async def test_cache_is_not_trusted_while_the_invalidation_listener_is_down(
    source: MemoryDocumentSource,
) -> None:
    store = MemoryCacheStore(clock=Clock())
    cache = DocumentCache(store, source="default")
    cache.after_subscribe()
    await eventually(lambda: _true(cache.trusted))
    docs = CallDocuments(
        context=named("handbook"), source=source, pins=MemoryPinBook()(_call("a")), cache=cache
    )
    await docs.metadata("handbook")

    cache.after_connection_lost()
    source.put("handbook", "rules, second edition")  # its publish is missed
    later = CallDocuments(
        context=named("handbook"), source=source, pins=MemoryPinBook()(_call("b")), cache=cache
    )
    assert (await later.metadata("handbook")).latest_version == "2"
    # Back: what was cached meanwhile is dropped before the cache is used again.
    cache.after_subscribe()
    await eventually(lambda: _true(cache.trusted))
    assert not [k for k in store.entries if k.endswith(":meta")]


def test_invoke_request_accepts_the_specification_document_context() -> None:
    request = InvokeRequested.model_validate(
        {
            "tool_id": "demo__read",
            "agent_context": {"agent_did": "did:example:a", "tenant_id": "acme"},
            "document_context": {
                "documents": [{"document_id": "handbook", "version": "1"}, {"document_id": "faq"}],
                "source": "default",
            },
        }
    )
    assert request.document_context is not None
    assert [d.version for d in request.document_context.documents] == ["1", None]


@pytest.mark.parametrize(
    "context",
    [
        {"documents": [{"document_id": "a"}, {"document_id": "a"}]},
        {"documents": [{"document_id": "a", "extra": 1}]},
        {"documents": [{"document_id": "../etc"}]},
        {"documents": [{"document_id": "a", "version": ""}]},
    ],
)
def test_malformed_document_context_is_refused(context: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        InvokeRequested.model_validate(
            {
                "tool_id": "demo__read",
                "agent_context": {"agent_did": "d", "tenant_id": "acme"},
                "document_context": context,
            }
        )


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (ErrorCode.DOCUMENT_NOT_FOUND, False),
        (ErrorCode.DOCUMENT_ACCESS_DENIED, False),
        (ErrorCode.DOCUMENT_VERSION_CONFLICT, False),
        (ErrorCode.DOCUMENT_SOURCE_UNAVAILABLE, True),
    ],
)
def test_document_errors_round_trip_with_their_retry_flag(code: ErrorCode, retryable: bool) -> None:
    error = error_from(ErrorInfo(code=code, message="m"))
    assert error.code is code
    assert error.to_error_info().retryable is retryable


async def _true(value: bool) -> bool:
    return value


async def test_a_tool_reading_documents_is_tested_locally_with_the_twins(
    source: MemoryDocumentSource,
) -> None:
    pins = MemoryDocumentPins()
    docs = CallDocuments(context=named("handbook"), source=source, pins=pins)
    ctx = context_for(read_document, documents=docs)
    run = await run_tool(read_document, {"document_id": "handbook"}, ctx=ctx)
    assert run.ok, run.error
    assert run.result == {
        "versions_seen": ["1"],
        "content": "rules, first edition",
        "resumed_from_step": None,
    }
    assert pins.pins == {"handbook": "1"}
    denied = await run_tool(
        read_document, {"document_id": "faq"}, ctx=context_for(read_document, documents=docs)
    )
    assert denied.error is not None
    assert denied.error.code is ErrorCode.DOCUMENT_ACCESS_DENIED


def _call(invocation_id: str) -> CallKey:
    return CallKey(tenant_id="t1", invocation_id=invocation_id)
