"""Log lines: the fields a call passed, the context's ids, and nothing else."""

from __future__ import annotations

import json
import logging

from toolfleet.observability.logs import ConsoleFormatter, JsonFormatter, log_context


def _record(**extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "toolfleet.bus.runtime", "levelname": "WARNING"})
    record.msg = "step failed, retrying"
    record.__dict__.update(extra)
    return record


def test_console_logs_show_the_fields_a_call_passed() -> None:
    with log_context(tenant_id="acme"):
        line = ConsoleFormatter().format(_record(error="InternalClientError"))
    assert line == (
        "WARNING toolfleet.bus.runtime: step failed, retrying error=InternalClientError "
        "tenant_id=acme"
    )


def test_json_logs_show_the_fields_a_call_passed() -> None:
    with log_context(tenant_id="acme"):
        line = JsonFormatter("executor").format(_record(error="InternalClientError"))
    assert '"error": "InternalClientError"' in line
    assert '"tenant_id": "acme"' in line


def test_uvicorns_coloured_copy_of_the_message_is_not_repeated() -> None:
    record = _record(color_message="Started server process [\x1b[36m%d\x1b[0m]")
    record.msg, record.args = "Started server process [%d]", (42,)
    console = ConsoleFormatter().format(record)
    assert console == "WARNING toolfleet.bus.runtime: Started server process [42]"
    assert "color_message" not in json.loads(JsonFormatter("api").format(record))


def test_an_inner_context_adds_to_the_outer_one_and_wins_and_ends_with_its_block() -> None:
    def fields() -> dict[str, object]:
        line = json.loads(JsonFormatter("policy").format(_record()))
        return {k: line[k] for k in ("tenant_id", "invocation_id", "trace_id") if k in line}

    with log_context(tenant_id="acme", invocation_id="i-1"):
        with log_context(invocation_id="i-2", trace_id=None):  # None: left out
            assert fields() == {"tenant_id": "acme", "invocation_id": "i-2"}
        assert fields() == {"tenant_id": "acme", "invocation_id": "i-1"}
    assert fields() == {}


def test_a_traceparent_in_the_context_is_logged_as_its_trace_id() -> None:
    def fields() -> dict[str, object]:
        line = json.loads(JsonFormatter("policy").format(_record()))
        return {k: line[k] for k in ("trace_id", "traceparent") if k in line}

    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with log_context(traceparent=f"00-{trace_id}-00f067aa0ba902b7-01"):
        assert fields() == {"trace_id": trace_id}
        with log_context(traceparent="00-not-a-traceparent"):  # invalid: no trace id
            assert fields() == {"trace_id": trace_id}
    with log_context(traceparent=None):
        assert fields() == {}
