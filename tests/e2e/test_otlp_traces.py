"""Every service as a process, exporting OTLP to a collector: one invocation, one trace.

The fleet runs with ``TOOLFLEET_OTEL_EXPORTER=otlp`` (a default install) and its
endpoint pointed at an in-process OTLP/HTTP collector; the request is published without
a ``traceparent``, so the fleet starts its trace. The span processors' export delay
is set longer than the test, so the spans that arrive are the ones each worker flushes
when it is stopped: nothing is lost at shutdown.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.eventually import eventually
from tests.support.fleet import process_fleet
from tests.support.otlp import otlp_collector
from tests.support.pipeline import fleet_settings
from toolfleet.events.envelope import new_event
from toolfleet.events.identity import trace_id_of
from toolfleet.events.models import AgentContext, InvocationStatus, InvokeRequested
from toolfleet.events.types import EventType, TopicName
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TENANT = "t-otlp"
AGENT = "did:agent:otlp"
SERVICES = {"policy", "executor", "validator", "audit", "status"}


async def test_one_invocation_is_one_exported_trace_across_the_services(
    settings: FleetSettings, tmp_path: Path
) -> None:
    local = fleet_settings(settings, tmp_path)
    with otlp_collector() as collector:
        async with process_fleet(
            local,
            tmp_path,
            TOOLFLEET_OTEL_EXPORTER="otlp",
            TOOLFLEET_OTEL_ENDPOINT=collector.url,
            OTEL_BSP_SCHEDULE_DELAY="600000",  # export only when flushed at shutdown
        ) as (fleet, procs):
            invocation_id = str(uuid.uuid4())
            request = InvokeRequested(
                invocation_id=uuid.UUID(invocation_id),
                tool_id="core__long_running",
                agent_context=AgentContext(agent_did=AGENT, tenant_id=TENANT),
                parameters={"steps": 2, "step_seconds": 0.05},
                capability_token=fleet.token(TENANT, AGENT),
            )
            # Published bare, without a traceparent: the fleet starts the trace.
            handle = fleet.client.expect(invocation_id, tenant_id=TENANT)
            await fleet.publish(
                new_event(
                    event_type=EventType.INVOKE_REQUESTED,
                    source="/agents/otlp-test",
                    data=request.model_dump(mode="json"),
                    tenant_id=TENANT,
                    invocation_id=invocation_id,
                )
            )
            outcome = await fleet.client.wait(handle, timeout=90)
            assert outcome.status is InvocationStatus.SUCCESS
            (result,) = await fleet.read(TopicName.RESULTS, invocation_id=invocation_id)
            trace_id = trace_id_of(result.traceparent)
            assert trace_id is not None

            async def audited() -> bool:
                audit = await fleet.read(TopicName.AUDIT, invocation_id=invocation_id)
                return any(e.type == EventType.SUCCEEDED for e in audit)

            await eventually(audited, timeout=60)
            procs.stop_all()
            logs = procs.logs()

        spans = collector.trace(trace_id)
        by_service = {s.service.removeprefix("toolfleet-") for s in spans}
        assert by_service >= SERVICES, (by_service, logs)
        names = {s.name for s in spans}
        assert f"process {EventType.INVOKE_REQUESTED}" in names
        assert any(n.startswith("execute_tool ") for n in names), names
        assert any(n.startswith("send ") for n in names), names
        # Policy, the first service to read the request, records the trace's one root;
        # every other span's parent is a span of the trace: no hole in the tree.
        (root,) = [s for s in spans if s.parent_span_id is None]
        assert (root.service, root.name) == (
            "toolfleet-policy",
            f"start {EventType.INVOKE_REQUESTED}",
        )
        known = {s.span_id for s in spans}
        assert {s.parent_span_id for s in spans if s is not root} <= known
        assert set(collector.paths) == {"/v1/traces"}
