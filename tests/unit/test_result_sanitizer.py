"""The hostile-result corpus through the real validator, once per result-rule mode.

``ValidatorService`` on in-memory twins, with the manifests ``@tool`` declares in
``tests.support.hostile_results``: what a client gets (result, warnings, error code)
for XSS, SQL and shell injection, prompt injection, invisible characters, deep and huge
results, in strict, coerce, escape, redact and reject modes.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import hostile_results as hostile
from toolfleet.contract.result_rules import ALL_CHECKS, ResultRules, parse_path
from toolfleet.errors import ErrorCode, RegistrationError
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import (
    AgentContext,
    ExecutionMetadata,
    InvocationStatus,
    InvokeExecuted,
    ResultBlob,
    ToolOutcome,
)
from toolfleet.events.types import EventType, Source
from toolfleet.registry.lookup import MemoryManifests, ToolLookup
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.results.coercion import coerce
from toolfleet.results.sanitizer import CompiledSanitizer, scan
from toolfleet.sdk import Results, spec_of
from toolfleet.sdk.testing import run_tool
from toolfleet.storage.blobs import MemoryBlobStore
from toolfleet.validator.service import ValidatorService

pytestmark = pytest.mark.unit

TENANT = "tenant_acme"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
TOOLS = {
    "strict": hostile.report_strict,
    "escape": hostile.report_escape,
    "redact": hostile.report_redact,
    "reject": hostile.report_reject,
    "mixed": hostile.report_mixed,
}


@pytest.fixture
def blobs() -> MemoryBlobStore:
    return MemoryBlobStore()


@pytest.fixture
def service(blobs: MemoryBlobStore) -> ValidatorService:
    manifests = [spec_of(fn).manifest() for fn in TOOLS.values()]
    return ValidatorService(
        lookup=ToolLookup(MemoryManifests(manifests)),
        schemas=CompiledSchemas(),
        blobs=blobs,
        inline_bytes=2_000_000,
    )


def _executed(mode: str, result: dict[str, Any], blob: ResultBlob | None = None) -> Envelope:
    invocation = uuid.uuid4()
    data = InvokeExecuted(
        invocation_id=invocation,
        tool_id=spec_of(TOOLS[mode]).tool_id,
        tool_version="1.0.0",
        agent_context=AgentContext(agent_did="did:agent:x", tenant_id=TENANT),
        result={} if blob else result,
        result_blob=blob,
        execution_metadata=ExecutionMetadata(duration_ms=1, started_at=NOW, completed_at=NOW),
    )
    return new_event(
        event_type=EventType.INVOKE_EXECUTED,
        source=Source.EXECUTOR,
        data=data,
        tenant_id=TENANT,
        invocation_id=str(invocation),
    )


async def _outcome(service: ValidatorService, mode: str, result: dict[str, Any]) -> ToolOutcome:
    [(_, envelope)] = await service.on_executed(_executed(mode, result))
    return envelope.data_as(ToolOutcome)


def _findings(outcome: ToolOutcome) -> list[tuple[str, str]]:
    assert outcome.error is not None
    return [(f["rule"], f["field"]) for f in outcome.error.details["findings"]]


@pytest.mark.parametrize("mode", hostile.MODES)
@pytest.mark.parametrize("case", hostile.CORPUS, ids=lambda c: c.name)
async def test_each_hostile_string_per_mode(
    service: ValidatorService, case: hostile.Hostile, mode: str
) -> None:
    outcome = await _outcome(service, mode, {"title": "t", "body": case.body})
    want = hostile.expected(case, mode)
    if want is None:
        assert outcome.status is InvocationStatus.ERROR
        assert outcome.error is not None
        assert outcome.error.code is ErrorCode.RESULT_SANITIZATION_REJECTED
        assert not outcome.error.retryable
        assert sorted(_findings(outcome)) == sorted((r, "$.body") for r in case.rules)
        assert case.body not in json.dumps(outcome.model_dump(mode="json"), ensure_ascii=False)
        return
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert outcome.result["body"] == want
    if mode == "strict":
        assert outcome.warnings == []
    else:
        verb = "escaped" if mode == "escape" else "redacted"
        assert outcome.warnings == [f"result field $.body: {r} {verb}" for r in case.rules]


@pytest.mark.parametrize("mode", [*hostile.MODES, "mixed"])
async def test_benign_text_with_every_metacharacter_passes_every_mode(
    service: ValidatorService, mode: str
) -> None:
    result = {"title": hostile.BENIGN, "body": hostile.BENIGN, "tags": [hostile.BENIGN]}
    outcome = await _outcome(service, mode, result)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert (outcome.result["body"], outcome.result["tags"]) == (hostile.BENIGN, [hostile.BENIGN])
    assert outcome.warnings == []


async def test_rules_by_field_path_pick_the_most_specific(service: ValidatorService) -> None:
    xss = "<script>x</script>"
    result = {"title": xss, "body": xss, "tags": ["a", f"b{hostile.TAGS}", xss]}
    outcome = await _outcome(service, "mixed", result)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert outcome.result["title"] == xss  # $.title: allow
    assert outcome.result["body"] == "&lt;script&gt;x&lt;/script&gt;"  # $.body: escape
    assert outcome.result["tags"] == ["a", "b", xss]  # $.tags[*]: only prompt/invisible checks
    assert outcome.warnings == [
        "result field $.body: html.script escaped",
        "result field $.tags[1]: unicode.tag_characters redacted",
    ]
    # Anything no rule names falls to "*": reject.
    rejected = await _outcome(service, "mixed", {"nested": {"note": "x' OR 1=1 --"}})
    assert rejected.error is not None
    assert rejected.error.code is ErrorCode.RESULT_SANITIZATION_REJECTED
    assert _findings(rejected) == [("sql.tautology", "$.nested.note")]
    assert "sql.tautology at $.nested.note" in rejected.error.message


async def test_coerce_mode_converts_listed_values_and_reports_each(
    service: ValidatorService,
) -> None:
    result = {"count": "42", "ok": "true", "tags": "solo", "day": "2026-02-03", "title": "-7"}
    strict = await _outcome(service, "strict", result)
    assert strict.error is not None
    assert strict.error.code is ErrorCode.RESULT_VALIDATION_FAILED
    assert {e["field"] for e in strict.error.details["errors"]} == {"count", "ok", "tags"}
    outcome = await _outcome(service, "escape", result)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert outcome.result["count"] == 42
    assert outcome.result["ok"] is True
    assert outcome.result["tags"] == ["solo"]
    assert outcome.result["title"] == "-7"  # already a string: left alone
    assert outcome.warnings == [
        "result coerced at $.count: string to integer",
        "result coerced at $.ok: string to boolean",
        "result coerced at $.tags: string to array",
    ]


@pytest.mark.parametrize(
    ("result", "field", "expected"),
    [
        ({"count": "forty-two"}, "$.count", "integer"),
        ({"count": "1e400"}, "$.count", "integer"),
        ({"count": " 4 "}, "$.count", "integer"),
        ({"ok": "yes"}, "$.ok", "boolean"),
        ({"ok": "True"}, "$.ok", "boolean"),
        ({"day": "2026-02-30"}, "$.day", "ISO 8601 date"),
        ({"tags": [{"a": 1}]}, "$.tags[0]", "string"),
    ],
)
async def test_coerce_mode_fails_typed_when_no_listed_coercion_fits(
    service: ValidatorService, result: dict[str, Any], field: str, expected: str
) -> None:
    outcome = await _outcome(service, "escape", result)
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.RESULT_COERCION_FAILED
    assert not outcome.error.retryable
    assert outcome.error.details["errors"] == [{"field": field, "expected": expected}]
    for value in result.values():
        assert json.dumps(value) not in json.dumps(outcome.error.model_dump(mode="json"))


@pytest.mark.parametrize("mode", [*hostile.MODES, "mixed"])
async def test_a_deeply_nested_result_is_too_large_in_every_mode(
    service: ValidatorService, mode: str
) -> None:
    nested: Any = 1
    for _ in range(100):
        nested = {"n": nested}
    outcome = await _outcome(service, mode, {"nested": nested})
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.RESULT_TOO_LARGE
    assert outcome.error.details == {"limit": "depth", "max": 64}


@pytest.mark.parametrize("mode", [*hostile.MODES, "mixed"])
async def test_a_result_over_the_tool_limit_is_too_large(
    service: ValidatorService, blobs: MemoryBlobStore, mode: str
) -> None:
    body = "a" * hostile.LIMIT + "<script>x</script>"
    raw = json.dumps({"body": body}).encode()
    event = _executed(mode, {})
    invocation = str(event.invocationid)
    blob_id = await blobs.put(raw, tenant_id=TENANT, invocation_id=invocation, purpose="transfer")
    event = _executed(mode, {}, ResultBlob(blob_id=blob_id, bytes=len(raw)))
    data = event.data_as(InvokeExecuted).model_copy(update={"invocation_id": uuid.UUID(invocation)})
    event = event.model_copy(update={"data": data.model_dump(mode="json")})
    [(_, envelope)] = await service.on_executed(event)
    outcome = envelope.data_as(ToolOutcome)
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.RESULT_TOO_LARGE
    assert not outcome.error.retryable
    assert outcome.error.details["limit"] == "bytes"


@pytest.mark.parametrize(("mode", "body_end"), [("escape", "&lt;script&gt;"), ("reject", None)])
async def test_a_huge_string_just_under_the_limit_is_sanitized_in_linear_time(
    service: ValidatorService, mode: str, body_end: str | None
) -> None:
    # Many openers with no closer: a backtracking pattern would go quadratic here.
    body = "<a " * 300_000 + "<script>"
    started = time.perf_counter()
    outcome = await _outcome(service, mode, {"body": body})
    elapsed = time.perf_counter() - started
    if body_end is None:
        assert outcome.error is not None
        assert outcome.error.code is ErrorCode.RESULT_SANITIZATION_REJECTED
    else:
        assert outcome.result is not None
        assert outcome.result["body"].endswith(body_end)
    assert elapsed < 10, f"{len(body)} characters took {elapsed:.1f} s"


def test_rules_are_checked_when_the_tool_is_declared() -> None:
    for bad, option in (
        ({"validation": "lenient"}, "validation"),
        ({"sanitize": {"$.body": "scrub"}}, r"sanitize\.\$\.body"),
        ({"sanitize": {"$.body[": "escape"}}, "sanitize"),
        ({"sanitize": {"$.body": {"action": "escape", "checks": ["css"]}}}, "checks"),
        ({"max_bytes": 0}, "max_bytes"),
    ):
        # Refused where it is written, naming the option, before any tool is declared.
        with pytest.raises(RegistrationError, match=f"invalid result rules: .*{option}"):
            Results(**bad)


def test_paths_parse_to_segments() -> None:
    assert parse_path("$.items[*].title") == ("items", -1, "title")
    assert parse_path("$.meta.*") == ("meta", "*")
    assert parse_path("rows[0]") == ("rows", 0)
    assert parse_path("$") == ()


def test_the_rules_travel_in_the_manifest() -> None:
    manifest = spec_of(hostile.report_mixed).manifest()
    stored = type(manifest).model_validate(json.loads(manifest.model_dump_json()))
    assert stored.result_rules == manifest.result_rules
    assert stored.result_rules.mode == "coerce"
    assert spec_of(hostile.report_strict).manifest().result_rules.sanitize == {}
    assert ResultRules().mode == "strict"


_PLAIN = st.text(
    alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd", "Zs")), max_size=200
)


@given(_PLAIN)
def test_plain_prose_is_never_changed(text: str) -> None:
    for action in ("escape", "redact", "reject"):
        sanitized = CompiledSanitizer(ResultRules(sanitize={"*": action}).sanitize).apply(
            {"body": text}
        )
        assert sanitized.value == {"body": text}
        assert sanitized.findings == []


@given(st.sampled_from(hostile.CORPUS), _PLAIN, _PLAIN)
def test_an_attack_inside_prose_is_found_and_never_echoed(
    case: hostile.Hostile, before: str, after: str
) -> None:
    text = f"{before} {case.body} {after}"
    _, rules = scan(text, ALL_CHECKS)
    assert set(case.rules) <= set(rules)
    sanitized = CompiledSanitizer(ResultRules(sanitize={"*": "redact"}).sanitize).apply(
        {"body": text}
    )
    assert sanitized.findings
    assert all(f.field == "$.body" for f in sanitized.findings)
    assert all(case.body not in line for line in sanitized.warnings())


async def test_a_local_run_applies_the_rules_as_the_validator_does() -> None:
    run = await run_tool(
        hostile.report_mixed, {"result": {"count": "3", "body": "<script>x</script>"}}
    )
    assert run.ok, run.error
    assert run.result is not None
    assert (run.result["count"], run.result["body"]) == (3, "&lt;script&gt;x&lt;/script&gt;")
    assert run.warnings == [
        "result coerced at $.count: string to integer",
        "result field $.body: html.script escaped",
    ]
    rejected = await run_tool(hostile.report_reject, {"result": {"title": "x' OR 1=1 --"}})
    assert rejected.error is not None
    assert rejected.error.code is ErrorCode.RESULT_SANITIZATION_REJECTED


async def test_keys_are_checked_and_paths_never_carry_a_hostile_key(
    service: ValidatorService,
) -> None:
    hostile_key = "<script>steal()</script>"
    rejected = await _outcome(service, "reject", {"nested": {hostile_key: 1, "ok": 2}})
    assert rejected.error is not None
    assert _findings(rejected) == [("html.script", "$.nested{key}")]
    assert "steal" not in json.dumps(rejected.model_dump(mode="json"))
    escaped = await _outcome(service, "escape", {"nested": {hostile_key: {"x": "a' OR 1=1"}}})
    assert escaped.result is not None
    assert escaped.result["nested"] == {"&lt;script&gt;steal()&lt;/script&gt;": {"x": "a'' OR 1=1"}}
    assert escaped.warnings == [
        "result field $.nested{key}: html.script escaped",
        "result field $.nested.*.x: sql.tautology escaped",
    ]
    # Two keys that escape to the same text: refused rather than one silently dropped.
    collide = {"nested": {"<script>": 1, "&lt;script&gt;": 2}}
    refused = await _outcome(service, "escape", collide)
    assert refused.error is not None
    assert refused.error.code is ErrorCode.RESULT_SANITIZATION_REJECTED
    assert _findings(refused) == [("key.collision", "$.nested{key}")]


_REPORT_SCHEMA = hostile.Report.model_json_schema()


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "title": st.text(max_size=20),
            "count": st.integers(),
            "ok": st.booleans(),
            "tags": st.lists(st.text(max_size=5), max_size=3),
            "day": st.none() | st.dates().map(lambda d: d.isoformat()),
        },
    )
)
def test_coercion_leaves_a_result_of_the_right_types_alone(result: dict[str, Any]) -> None:
    coerced = coerce(_REPORT_SCHEMA, result)
    assert coerced.value == result
    assert coerced.applied == []


@given(st.integers(min_value=-(10**20), max_value=10**20), st.booleans())
def test_numeric_and_boolean_strings_coerce_to_their_values(number: int, flag: bool) -> None:
    coerced = coerce(_REPORT_SCHEMA, {"count": str(number), "ok": str(flag).lower()})
    assert coerced.value == {"count": number, "ok": flag}
    assert coerced.applied == ["$.count: string to integer", "$.ok: string to boolean"]
