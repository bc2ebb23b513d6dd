"""Event types, topics and sources of the contract (section 1), and executor pools' topics."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final


class EventType(StrEnum):
    """Every CloudEvents ``type`` toolfleet produces or consumes."""

    INVOKE_REQUESTED = "ai.agent.tool.invoke.requested"
    INVOKE_AUTHORIZED = "ai.agent.tool.invoke.authorized"
    INVOKE_EXECUTED = "ai.agent.tool.invoke.executed"
    INVOKE_QUEUED = "ai.agent.tool.invoke.queued"
    SUCCEEDED = "ai.agent.tool.succeeded"
    FAILED = "ai.agent.tool.failed"
    TIMEOUT = "ai.agent.tool.timeout"
    CANCELLED = "ai.agent.tool.cancelled"
    INVOKED = "ai.agent.tool.invoked"
    CHECKPOINT_CREATED = "ai.agent.tool.checkpoint.created"
    APPROVAL_REQUESTED = "ai.agent.tool.approval.requested"
    CONTROL_REFUSED = "ai.agent.tool.control.refused"
    OUTCOME_REFUSED = "ai.agent.tool.outcome.refused"
    EGRESS = "ai.agent.tool.egress"
    CIRCUIT_OPENED = "ai.agent.circuit.opened"
    CIRCUIT_CLOSED = "ai.agent.circuit.closed"
    TOOL_LIFECYCLE_CHANGED = "ai.agent.tool.lifecycle.changed"
    SOURCE_TOOL_ADDED = "ai.agent.tool.source.tool_added"
    CANCEL_REQUESTED = "ai.agent.tool.cancel.requested"
    APPROVAL_GRANTED = "ai.agent.tool.approval.granted"
    APPROVAL_DENIED = "ai.agent.tool.approval.denied"
    DLQ_RECORD = "ai.agent.toolfleet.dlq.record"
    ANOMALY = "ai.agent.tool.anomaly"


TERMINAL_TYPES: frozenset[EventType] = frozenset(
    {EventType.SUCCEEDED, EventType.FAILED, EventType.TIMEOUT, EventType.CANCELLED}
)


class TopicName(StrEnum):
    """Topic names without the configurable prefix."""

    REQUESTED = "invoke.requested"
    AUTHORIZED = "invoke.authorized"
    EXECUTED = "invoke.executed"
    RESULTS = "invoke.results"
    EVENTS = "invoke.events"
    CONTROL = "invoke.control"
    AUDIT = "audit"
    DLQ = "dlq"


TOPIC_OF_TYPE: dict[EventType, TopicName] = {
    EventType.INVOKE_REQUESTED: TopicName.REQUESTED,
    EventType.INVOKE_AUTHORIZED: TopicName.AUTHORIZED,
    EventType.INVOKE_EXECUTED: TopicName.EXECUTED,
    EventType.SUCCEEDED: TopicName.RESULTS,
    EventType.FAILED: TopicName.RESULTS,
    EventType.TIMEOUT: TopicName.RESULTS,
    EventType.CANCELLED: TopicName.RESULTS,
    EventType.INVOKE_QUEUED: TopicName.EVENTS,
    EventType.INVOKED: TopicName.EVENTS,
    EventType.CHECKPOINT_CREATED: TopicName.EVENTS,
    EventType.APPROVAL_REQUESTED: TopicName.EVENTS,
    EventType.CONTROL_REFUSED: TopicName.EVENTS,
    EventType.OUTCOME_REFUSED: TopicName.EVENTS,
    EventType.EGRESS: TopicName.EVENTS,
    EventType.CIRCUIT_OPENED: TopicName.EVENTS,
    EventType.CIRCUIT_CLOSED: TopicName.EVENTS,
    EventType.TOOL_LIFECYCLE_CHANGED: TopicName.EVENTS,
    EventType.SOURCE_TOOL_ADDED: TopicName.EVENTS,
    EventType.CANCEL_REQUESTED: TopicName.CONTROL,
    EventType.APPROVAL_GRANTED: TopicName.CONTROL,
    EventType.APPROVAL_DENIED: TopicName.CONTROL,
    EventType.DLQ_RECORD: TopicName.DLQ,
    EventType.ANOMALY: TopicName.AUDIT,
}

#: Topics whose events are lifecycle facts (audited and projected into status).
LIFECYCLE_TOPICS: tuple[TopicName, ...] = (
    TopicName.REQUESTED,
    TopicName.AUTHORIZED,
    TopicName.EXECUTED,
    TopicName.RESULTS,
    TopicName.EVENTS,
    TopicName.CONTROL,
)


class Source(StrEnum):
    """Stable ``source`` URI of each emitting service."""

    POLICY = "/toolfleet/policy"
    EXECUTOR = "/toolfleet/executor"
    VALIDATOR = "/toolfleet/validator"
    AUDIT = "/toolfleet/audit"
    STATUS = "/toolfleet/status"
    API = "/toolfleet/api"
    CLIENT = "/toolfleet/client"
    CLI = "/toolfleet/cli"
    ANALYTICS = "/toolfleet/analytics"


def topic(prefix: str, name: TopicName) -> str:
    """Full topic name, e.g. ``topic("toolfleet.", TopicName.RESULTS)``."""
    return f"{prefix}{name.value}"


# --- executor pools (contract section 9) ----------------------------------------------

DEFAULT_POOL: Final = "default"
"""The pool of a tool whose manifest names none; its calls stay on ``invoke.authorized``."""
POOL_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,31}$"
"""A pool name: lower-case letters, digits, ``-`` and ``_``, at most 32 characters. It
becomes a topic suffix (``invoke.authorized.<pool>``), so nothing else is allowed."""
_POOL_NAME: Final = re.compile(POOL_NAME_PATTERN)


def check_pool_name(name: str) -> str:
    """``name`` if it is a valid pool name; else :class:`ValueError` saying what is allowed."""
    if not isinstance(name, str) or not _POOL_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a pool name: lower-case letters, digits, '-' and '_', "
            "1 to 32 characters, starting with a letter or digit"
        )
    return name


def pool_topic(prefix: str, pool: str) -> str:
    """The topic executors of ``pool`` read: ``invoke.authorized`` for the default pool,
    ``invoke.authorized.<pool>`` for every other one (with the fleet's ``prefix``).

    Raises:
        ValueError: ``pool`` is not a valid pool name.
    """
    base = topic(prefix, TopicName.AUTHORIZED)
    return base if check_pool_name(pool) == DEFAULT_POOL else f"{base}.{pool}"


def pool_of_topic(prefix: str, name: str) -> str | None:
    """The pool whose topic ``name`` is (:func:`pool_topic` read backwards); None when it
    is no pool's topic."""
    base = topic(prefix, TopicName.AUTHORIZED)
    if name == base:
        return DEFAULT_POOL
    pool = name.removeprefix(f"{base}.")
    if pool in (name, DEFAULT_POOL) or not _POOL_NAME.fullmatch(pool):
        return None
    return pool


def pool_topics_pattern(prefix: str) -> str:
    """A regular expression of every pool's topic but the default pool's
    (``invoke.authorized.<pool>``), for consumers that read them all (observers)."""
    return re.escape(f"{topic(prefix, TopicName.AUTHORIZED)}.") + POOL_NAME_PATTERN[1:-1]
