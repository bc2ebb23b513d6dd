"""Structured JSON logs carrying tenant, invocation and trace ids from context."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from toolfleet.events.identity import trace_id_of

_CONTEXT: contextvars.ContextVar[tuple[dict[str, str | None], ...]] = contextvars.ContextVar(
    "toolfleet_log_context", default=()
)
_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {
    "message",
    "asctime",
    "color_message",  # uvicorn repeats every message with ANSI colour codes in it
}


class log_context:  # lower case: used as a function, ``with log_context(...):``
    """Add fields (``tenant_id``, ``invocation_id``, ``trace_id`` ...) to every log line
    written inside the block; fields without a value are left out, an inner block's win.
    A ``traceparent`` field is written as its trace id (``trace_id``; left out when it
    is not a valid one).

    Entered for every record a consumer handles, and read only when a line is written:
    the fields are merged then, and a ``traceparent`` parsed then, not on the way in
    (most records write no line)."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: str | None) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        self._token = _CONTEXT.set((*_CONTEXT.get(), self._fields))

    def __exit__(self, *_: object) -> None:
        _CONTEXT.reset(self._token)


def context_fields() -> dict[str, str]:
    """The fields of the log contexts entered here, inner ones winning."""
    merged: dict[str, str] = {}
    for fields in _CONTEXT.get():
        for name, value in fields.items():
            if name == "traceparent":
                name, value = "trace_id", trace_id_of(value)
            if value:
                merged[name] = value
    return merged


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
            **context_fields(),
        }
        entry.update(_extras(record))
        if record.exc_info and record.exc_info[0] is not None:
            # The type only: exception messages can carry data we must not log.
            entry["exc_type"] = record.exc_info[0].__name__
        return json.dumps(entry, default=str)


class ConsoleFormatter(logging.Formatter):
    """One line: level, logger, message, then the record's fields and the context's."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {**_extras(record), **context_fields()}
        if record.exc_info and record.exc_info[0] is not None:
            fields["exc_type"] = record.exc_info[0].__name__
        ctx = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{record.levelname:<7} {record.name}: {record.getMessage()} {ctx}".rstrip()


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a call passed with ``extra=``."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _RESERVED and not key.startswith("_")
    }


def configure_logging(*, service: str, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Library chatter (connection retries, rebalances) at WARNING unless asked for.
    for noisy in ("aiokafka", "kafka", "asyncio", "uvicorn.access", "httpx"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
