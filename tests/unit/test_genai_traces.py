"""The executor's run span as agent-observability tools read it: OpenTelemetry's GenAI
conventions for tool execution, on the in-memory span exporter."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY

from tests.unit.test_executor_admission import authorized, outcome, rig
from toolfleet.events.models import ExecutionOptions

pytestmark = pytest.mark.unit

RUNNER_CALL_ID = "tfc_" + "ab" * 20


def _run_span(exporter: InMemorySpanExporter, tool_id: str) -> dict[str, object]:
    (found,) = [s for s in exporter.get_finished_spans() if s.name == f"execute_tool {tool_id}"]
    return {"attributes": dict(found.attributes or {}), "status": found.status.status_code}


async def test_a_runner_call_is_an_execute_tool_span_with_its_call_id(
    exported: InMemorySpanExporter,
) -> None:
    parts = rig()
    key = uuid.uuid4().hex
    event = authorized(
        "test__cached",
        {"key": key},
        execution_options=ExecutionOptions(idempotency_key=RUNNER_CALL_ID),
    )
    await outcome(parts, event)
    seen = _run_span(exported, "test__cached")
    attributes = seen["attributes"]
    assert attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "test__cached",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": RUNNER_CALL_ID,
        "toolfleet.tool.id": "test__cached",
        "toolfleet.tool.version": "1.0.0",
    }
    # No parameter or result values on the span.
    assert key not in repr(attributes)
    assert seen["status"] is not StatusCode.ERROR


async def test_a_failed_run_has_error_type_and_no_foreign_call_id(
    exported: InMemorySpanExporter,
) -> None:
    parts = rig()
    event = authorized(
        "test__breaker",
        {"fail": True},
        execution_options=ExecutionOptions(idempotency_key="someone-elses-key"),
    )
    await outcome(parts, event)
    seen = _run_span(exported, "test__breaker")
    attributes = seen["attributes"]
    assert isinstance(attributes, dict)
    assert attributes["error.type"] == "external_api_error"
    assert "gen_ai.tool.call.id" not in attributes  # not the runner's: not a call id
    assert seen["status"] is StatusCode.ERROR


def _genai_count(tool_id: str, error_type: str) -> float:
    value = REGISTRY.get_sample_value(
        "gen_ai_client_operation_duration_seconds_count",
        {
            "gen_ai_operation_name": "execute_tool",
            "gen_ai_tool_name": tool_id,
            "error_type": error_type,
        },
    )
    return value or 0.0


async def test_the_genai_duration_metric_counts_runs_beside_toolfleets() -> None:
    parts = rig()
    ok_before = _genai_count("test__cached", "")
    failed_before = _genai_count("test__breaker", "external_api_error")
    await outcome(parts, authorized("test__cached", {"key": uuid.uuid4().hex}))
    await outcome(parts, authorized("test__breaker", {"fail": True}))
    assert _genai_count("test__cached", "") == ok_before + 1
    assert _genai_count("test__breaker", "external_api_error") == failed_before + 1
