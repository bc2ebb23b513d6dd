"""The live status projection against its frozen oracle (tests/support/projection_reference.py).

Same events in, same results out: the same fact (or the same ``None``, or the same
error), the same timeline detail, and the same row after every step of a fold, for
lifecycles in order, shuffled, repeated, of two tenants, and for events whose ``data``
is damaged one member at a time (wrong type, missing, extra, out of range, odd text and
datetimes). Compared strictly: ``1`` is not ``1.0`` and the datetimes' offsets count.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tests.support import projection_reference as reference
from tests.support.lifecycle import T0, Lifecycle
from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events import codec
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import (
    AgentContext,
    ApprovalDecision,
    ApprovalRequested,
    Attachment,
    CancelRequested,
    CheckpointConfig,
    CheckpointCreated,
    CheckpointRef,
    DocumentAccess,
    DocumentContext,
    DocumentRef,
    ExecutionMetadata,
    ExecutionOptions,
    InvocationStatus,
    InvokeAuthorized,
    InvokeExecuted,
    InvokeRequested,
    ResourceLimits,
    ResultBlob,
    ToolInvoked,
    ToolOutcome,
)
from toolfleet.status import projection as live

pytestmark = pytest.mark.unit

NOW = datetime(2030, 1, 1, tzinfo=UTC)
S = InvocationStatus
MODULES = (reference, live)


# --- strict comparison ---------------------------------------------------------------


def strict(value: Any) -> Any:
    """``value`` as nested tuples that keep every type (and dict order) visible."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple((f.name, strict(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    if isinstance(value, dict):
        return ("dict", tuple((strict(k), strict(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(strict(v) for v in value))
    if isinstance(value, datetime):
        tz = value.tzinfo
        return ("datetime", value.isoformat(), type(tz).__name__, tz.utcoffset(value) if tz else 0)
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.value)
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def outcome(module: ModuleType, event: Envelope) -> tuple[Any, Any]:
    """What ``fact_of`` makes of ``event``: (strict fact or error, the fact itself)."""
    try:
        fact = module.fact_of(event, now=NOW)
    except Exception as exc:
        details = getattr(exc, "details", None)
        return ("raised", type(exc).__name__, str(exc), strict(details)), None
    if fact is None:
        return None, None
    return (strict(fact), strict(fact.timeline_detail())), fact


def assert_same_fact(event: Envelope) -> tuple[Any, Any]:
    (ref, ref_fact), (got, got_fact) = (outcome(m, event) for m in MODULES)
    assert got == ref, event
    return ref_fact, got_fact


def assert_same_folds(events: Sequence[Envelope], start: Sequence[Envelope] = ()) -> None:
    """Fold ``start`` then ``events`` with both modules; equal rows after every step."""
    rows: list[Any] = [None, None]
    for i, module in enumerate(MODULES):
        for event in start:
            fact = module.fact_of(event, now=NOW)
            if fact is not None:
                rows[i] = module.apply(rows[i], fact)
    for event in events:
        ref_fact, got_fact = assert_same_fact(event)
        if ref_fact is None:
            continue
        before = list(rows)
        rows = [m.apply(r, f) for m, r, f in zip(MODULES, rows, (ref_fact, got_fact), strict=True)]
        assert strict(rows[1]) == strict(rows[0]), event
        # "the row itself" for another tenant's event: same identity answer in both
        assert (rows[0] is before[0]) == (rows[1] is before[1]) or rows[0] is None


# --- events ------------------------------------------------------------------------------


def _wire(event: Envelope) -> Envelope:
    message = codec.encode(event)
    return codec.decode(key=message.key, value=message.value, headers=message.headers)


def _with_data(event: Envelope, **changes: Any) -> Envelope:
    return event.model_copy(update={"data": {**event.data, **changes}})


def _metadata_rich(lc: Lifecycle) -> ExecutionMetadata:
    return ExecutionMetadata(
        duration_ms=1234,
        started_at=T0 + timedelta(seconds=2, microseconds=120_000),
        completed_at=T0 + timedelta(seconds=5),
        attempts=2,
        cpu_used_millicore_seconds=12.5,
        memory_peak_mb=64,
        checkpoints_created=[CheckpointRef(checkpoint_id="cp-1", timestamp=T0)],
        cached=False,
        truncated=True,
        attachments=[Attachment(url="s3://b/k", content_type="text/plain", bytes=10)],
        resumed_from_checkpoint_id="cp-1",
    )


def rich_events(lc: Lifecycle) -> list[Envelope]:
    """Every event type, with the optional members filled where they exist."""
    documents = [DocumentAccess(document_id="doc-1", version="3", access="read")]
    authorized = lc.authorized(at=1)
    executed = lc.executed(at=5)
    outcome_ = lc.outcome(S.ERROR, code=ErrorCode.TIMEOUT, at=6)
    error = ErrorInfo(
        code=ErrorCode.TIMEOUT,
        message="slow",
        details={"limit_s": 30, "seen": [1.5, None, {"k": "v"}], "ok": False},
        retryable=True,
        retry_after_s=2,
    ).model_dump(mode="json")
    return [
        lc.requested(
            at=0,
            resource_limits={"timeout_seconds": 10, "memory_mb_limit": 128},
            checkpoint_config={"checkpoint_interval_seconds": 5},
            document_context={"documents": [{"document_id": "doc-1", "version": "3"}]},
            connection_id="conn-1",
        ),
        _with_data(
            authorized,
            connection_id="conn-1",
            resource_limits=ResourceLimits(timeout_seconds=10).model_dump(mode="json"),
            document_context=DocumentContext(
                documents=[DocumentRef(document_id="doc-1")], source="s"
            ).model_dump(mode="json"),
            max_result_bytes=1000,
            grant="g.r.ant",
        ),
        _with_data(
            executed,
            result={},
            result_blob=ResultBlob(blob_id="b1", bytes=10).model_dump(mode="json"),
            execution_metadata=_metadata_rich(lc).model_dump(mode="json"),
            documents_accessed=[d.model_dump(mode="json") for d in documents],
            warnings=["w"],
            checkpoint_ref="cp-1",
        ),
        _with_data(
            outcome_,
            error=error,
            execution_metadata=_metadata_rich(lc).model_dump(mode="json"),
            documents_accessed=[d.model_dump(mode="json") for d in documents],
        ),
        lc.outcome(S.SUCCESS, at=7),
        lc.checkpoint(55.5, "", at=4),
        lc.checkpoint(0, "start", at=3),
        lc.checkpoint(100, "end", at=4.5),
        _with_data(lc.invoked(at=3, attempt=2), resumed_from_checkpoint_id="cp-1"),
        _with_data(
            lc.approval(granted=False, at=2),
            parameters_hash="a" * 64,
            signature="sig",
        ),
        _with_data(lc.cancel_requested(at=4), signature="sig"),
    ]


def plain_events(lc: Lifecycle) -> list[Envelope]:
    return [
        lc.requested(at=0),
        lc.authorized(at=1),
        lc.approval_requested(at=1.5),
        lc.approval(granted=True, at=2),
        lc.invoked(at=2),
        lc.checkpoint(30, "fetching", at=3),
        lc.checkpoint(70, "parsing", at=4),
        lc.checkpoint(70, "parsing", at=4.2),
        lc.executed(at=5),
        lc.cancel_requested(at=5.5),
        lc.outcome(S.SUCCESS, at=6),
        lc.outcome(S.CANCELLED, code=ErrorCode.CANCELLED, at=6.5),
    ]


def _lifecycles() -> list[list[Envelope]]:
    out = []
    for events in (
        plain_events(Lifecycle()),
        rich_events(Lifecycle(parameters={"q": "x", "password": "p", "n": [1, {"a": 2}]})),
        plain_events(Lifecycle(parameters={})),
    ):
        out.append(events)
        out.append([_wire(e) for e in events])
    return out


LIFECYCLES = _lifecycles()
POOL = [event for events in LIFECYCLES for event in events]


# --- damaged data ------------------------------------------------------------------------

UUID_TEXT = str(uuid.uuid4())
ODD_VALUES: list[Any] = [
    None,
    "",
    "x",
    "a" * 65,
    "a" * 257,
    "a" * 513,
    "\ud800",
    "é",
    "T_acme",
    "t acme",
    "t_acme\n",
    0,
    1,
    -1,
    2,
    1.0,
    1.5,
    -0.5,
    100,
    100.5,
    86_400,
    86_401,
    10**20,
    True,
    False,
    float("nan"),
    float("inf"),
    [],
    {},
    ["a"],
    [1],
    {"k": 1},
    {"k": float("nan")},
    {"\ud800": 1},
    [{"checkpoint_id": "c", "timestamp": "2025-01-01T12:00:00Z"}],
    UUID_TEXT,
    UUID_TEXT.upper(),
    UUID_TEXT.replace("-", ""),
    "{" + UUID_TEXT + "}",
    "not-a-uuid",
    "2025-01-01T12:00:02Z",
    "2025-01-01T12:00:02.5Z",
    "2025-01-01T12:00:02.000000Z",
    "2025-01-01T12:00:02.123456Z",
    "2025-01-01T12:00:02+00:00",
    "2025-01-01T12:00:02-00:00",
    "2025-01-01T12:00:02+01:00",
    "2025-01-01T12:00:02",
    "2025-01-01 12:00:02Z",
    "2025-01-01",
    "2025-13-01T00:00:00Z",
    "2025-01-01T24:00:00Z",
    1_735_732_800,
    "micro",
    "macro",
    "blob",
    "read",
    "high",
    "low",
    "success",
    "running",
    "pending",
    "timeout",
    "read_only",
    "0" * 64,
    "A" * 64,
]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _damaged(data: Any, path: tuple[Any, ...], how: str, odd: Any) -> Any:
    if not path:
        if how == "extra" and isinstance(data, dict):
            return {**data, "unexpected": odd}
        return odd
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        copy = dict(data)
        if not rest and how == "drop":
            del copy[head]
        else:
            copy[head] = _damaged(data[head], rest, how, odd)
        return copy
    copy_list = list(data)
    if not rest and how == "drop":
        del copy_list[head]
    else:
        copy_list[head] = _damaged(data[head], rest, how, odd)
    return copy_list


@st.composite
def damaged_events(draw: st.DrawFn) -> Envelope:
    event = draw(st.sampled_from(POOL))
    path = draw(st.sampled_from(list(_paths(event.data))))
    how = draw(st.sampled_from(["replace", "drop", "extra"]))
    odd = draw(st.sampled_from(ODD_VALUES))
    if how == "drop" and not path:
        how = "replace"
    return event.model_copy(update={"data": _damaged(event.data, path, how, odd)})


@given(damaged_events())
@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
def test_damaged_data_gives_the_same_fact_or_error(event: Envelope) -> None:
    assert_same_folds([event])
    assert_same_folds([event], start=LIFECYCLES[0][:2])


def test_every_member_replaced_by_every_odd_value() -> None:
    """The exhaustive version of the property above, on the rich lifecycle."""
    for event in LIFECYCLES[3]:
        for path in _paths(event.data):
            for how in ("replace", "drop", "extra"):
                for odd in ODD_VALUES if how != "drop" else [None]:
                    if how == "drop" and not path:
                        continue
                    data = _damaged(event.data, path, how, odd)
                    assert_same_fact(event.model_copy(update={"data": data}))


# --- attributes --------------------------------------------------------------------------

ATTRIBUTE_CHANGES: list[dict[str, Any]] = [
    {"time": None},
    {"tenantid": None},
    {"tenantid": "t_other"},
    {"tenantid": ""},
    {"invocationid": None},
    {"invocationid": str(uuid.uuid4())},
    {"invocationid": "not-a-uuid"},
    {"traceparent": None},
    {"traceparent": "garbage"},
    {"traceparent": "00-" + "0" * 32 + "-" + "1" * 16 + "-01"},
    {"traceparent": "00-" + "a" * 32 + "-" + "0" * 16 + "-01"},
    {"traceparent": "ff-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    {"traceparent": "01-" + "a" * 32 + "-" + "b" * 16 + "-01-extra"},
    {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01-extra"},
    {"traceparent": "00-" + "A" * 32 + "-" + "b" * 16 + "-01"},
    {"type": "ai.agent.circuit.opened"},
    {"type": "something.else"},
]


@pytest.mark.parametrize("change", ATTRIBUTE_CHANGES, ids=lambda c: repr(c)[:40])
def test_attributes_give_the_same_fact(change: dict[str, Any]) -> None:
    for event in POOL:
        assert_same_fact(event.model_copy(update=change))


def test_invocation_ids_in_any_spelling() -> None:
    lc = Lifecycle()
    for event in plain_events(lc):
        for raw in (
            lc.invocation_id.upper(),
            lc.invocation_id.replace("-", ""),
            "inv-not-a-uuid",
            "",
            None,
            7,
            "x" * 600,
        ):
            assert_same_fact(_with_data(event, invocation_id=raw))
            assert_same_fact(event.model_copy(update={"invocationid": raw, "data": {}}))


# --- folds -------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(LIFECYCLES)))
def test_lifecycles_in_order(index: int) -> None:
    assert_same_folds(LIFECYCLES[index])


@st.composite
def shuffled(draw: st.DrawFn) -> list[Envelope]:
    events = draw(st.sampled_from(LIFECYCLES))
    order = list(draw(st.permutations(events)))
    for event in draw(st.lists(st.sampled_from(events), max_size=5)):
        order.insert(draw(st.integers(0, len(order))), event)
    return order


@given(shuffled())
@settings(max_examples=200)
def test_shuffled_and_repeated_lifecycles(events: list[Envelope]) -> None:
    assert_same_folds(events)


@given(st.permutations(plain_events(Lifecycle()) + plain_events(Lifecycle(tenant="t_evil"))))
@settings(max_examples=200)
def test_two_tenants_on_one_invocation(events: list[Envelope]) -> None:
    invocation = events[0].invocationid
    same = [
        e.model_copy(
            update={"invocationid": invocation, "data": {**e.data, "invocation_id": invocation}}
        )
        for e in events
    ]
    assert_same_folds(same)


def _store_row(module: ModuleType, invocation_id: str, **changes: Any) -> Any:
    """A row as the store builds it from Postgres (``timezone.utc`` datetimes)."""
    base = module.InvocationRow(
        invocation_id=invocation_id,
        tenant_id="t_acme",
        tool_id="core__echo",
        created_at=T0,
    )
    return dataclasses.replace(base, **changes)


ROW_CHANGES: list[dict[str, Any]] = [
    {},
    {"status": S.RUNNING, "current_phase": "fetching", "progress_percent": 30.0},
    {"status": S.PENDING_APPROVAL, "current_phase": "awaiting_approval", "agent_did": "a"},
    {"status": S.SUCCESS, "current_phase": "completed", "progress_percent": 100.0},
    {"current_phase": "cancel_requested", "trace_id": "t", "parameters": {}},
    {"created_at": T0 + timedelta(days=1), "started_at": T0 + timedelta(days=1)},
    {"warnings": ("old",), "priority": "low", "idempotency_key": "k"},
]


@pytest.mark.parametrize("changes", ROW_CHANGES, ids=lambda c: ",".join(c) or "fresh")
def test_events_on_stored_rows(changes: dict[str, Any]) -> None:
    for event in POOL:
        facts = [m.fact_of(event, now=NOW) for m in MODULES]
        if facts[0] is None:
            continue
        rows = [_store_row(m, facts[0].invocation_id, **changes) for m in MODULES]
        applied = [m.apply(r, f) for m, r, f in zip(MODULES, rows, facts, strict=True)]
        assert strict(applied[1]) == strict(applied[0]), event


def test_checkpoint_rows_keep_checkpoints_from_the_store() -> None:
    lc = Lifecycle()
    for module_pair in [MODULES]:
        stored = [
            _store_row(
                m,
                lc.invocation_id,
                latest_checkpoint=m.Checkpoint.from_json(
                    {
                        "checkpoint_id": "cp-50",
                        "progress_percent": 50,
                        "current_phase": "",
                        "timestamp": "2025-01-01T12:00:03+00:00",
                    }
                ),
                progress_percent=50.0,
                current_phase="running",
            )
            for m in module_pair
        ]
        for event in (lc.checkpoint(50, "x", at=3), lc.checkpoint(40, "y"), lc.checkpoint(60)):
            out = []
            for module, row in zip(module_pair, stored, strict=True):
                fact = module.fact_of(event, now=NOW)
                out.append(module.apply(row, fact))
            assert strict(out[1]) == strict(out[0])


# --- the models the fast reader describes --------------------------------------------

READ_MODELS = (
    AgentContext,
    ApprovalDecision,
    ApprovalRequested,
    Attachment,
    CancelRequested,
    CheckpointConfig,
    CheckpointCreated,
    CheckpointRef,
    DocumentAccess,
    DocumentContext,
    DocumentRef,
    ErrorInfo,
    ExecutionMetadata,
    ExecutionOptions,
    InvokeAuthorized,
    InvokeExecuted,
    InvokeRequested,
    ResourceLimits,
    ResultBlob,
    ToolInvoked,
    ToolOutcome,
)


FINGERPRINTS = {
    "AgentContext": "08e6b9d1fdc7",
    "ApprovalDecision": "6a55b8ccf1e1",
    "ApprovalRequested": "e2a88045fb74",
    "Attachment": "769c684186ec",
    "CancelRequested": "1cb8eeb22955",
    "CheckpointConfig": "3a48cf024f22",
    "CheckpointCreated": "a2ce96b6b85f",
    "CheckpointRef": "c51337431b3e",
    "DocumentAccess": "c24903f9219b",
    "DocumentContext": "1ef62f4fe7cf",
    "DocumentRef": "018afc66f20d",
    "ErrorInfo": "ed180438f4e4",
    "ExecutionMetadata": "c354346fc9f4",
    "ExecutionOptions": "99ef77ae9925",
    "InvokeAuthorized": "42ec7271e77a",
    "InvokeExecuted": "e36b6ed5ba48",
    "InvokeRequested": "31cdf593b9a3",
    "ResourceLimits": "6ede3388013f",
    "ResultBlob": "2298e3915883",
    "ToolInvoked": "1a0836105bdf",
    "ToolOutcome": "6bd2a8a72242",
}


def _fingerprint(model: type[BaseModel]) -> str:
    decorators = model.__pydantic_decorators__
    text = "\n".join(
        [
            repr(model.model_config.get("extra")),
            *(f"{name}: {info!r}" for name, info in model.model_fields.items()),
            *sorted(decorators.field_validators),
            *sorted(decorators.model_validators),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def test_the_fast_reader_knows_every_model_it_reads() -> None:
    """A changed event model needs its fast reader in projection.py changed too.

    The fast reader checks each member by hand (type, bounds, pattern, strict or not):
    once it matches the model again, and the damaged-data tests above pass, update the
    fingerprint here.
    """
    assert {m.__name__: _fingerprint(m) for m in READ_MODELS} == FINGERPRINTS
