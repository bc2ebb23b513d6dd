"""The text of ``schemas/`` (JSON Schema 2020-12 + AsyncAPI 3.0), from the event models.

The files are the published contract; they are derived from the pydantic models here
and from the routing table (:mod:`toolfleet.events.routing`, the AsyncAPI operations),
and checked in; a unit test fails when the two drift. Output is deterministic (sorted
keys, stable order) so a diff of ``schemas/`` shows exactly what changed. This module
only builds the text (:func:`render`); ``python -m toolfleet.cli.schemas`` (``make
schemas``) writes the files.

``$id`` URIs are identifiers under :data:`SCHEMA_BASE_URI`; the AsyncAPI document
references the schema files by relative path, so the directory works offline.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from toolfleet.contract.manifest import ToolManifest
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import (
    TENANT_ID_PATTERN,
    AnomalyDetected,
    ApprovalDecision,
    ApprovalRequested,
    AuditRecord,
    CancelRequested,
    CheckpointCreated,
    CircuitChanged,
    ControlRefused,
    DlqRecord,
    EgressDecided,
    InvokeAuthorized,
    InvokeExecuted,
    InvokeQueued,
    InvokeRequested,
    OutcomeRefused,
    SourceToolAdded,
    ToolInvoked,
    ToolLifecycleChanged,
    ToolOutcome,
)
from toolfleet.events.outcomes import _TYPE_OF_STATUS
from toolfleet.events.routing import DEAD_LETTER, ROUTING, Route, types_on
from toolfleet.events.types import (
    LIFECYCLE_TOPICS,
    POOL_NAME_PATTERN,
    TOPIC_OF_TYPE,
    EventType,
    TopicName,
)

#: Version of the external contract these files describe (CONTRACT.md "v1").
CONTRACT_VERSION = "1.0.0"
#: Base of every schema's ``$id``: an identifier, not necessarily a fetchable URL.
SCHEMA_BASE_URI = "https://toolfleet.dev/schemas/v1/"
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
DEFAULT_TOPIC_PREFIX = "toolfleet."
DEFAULT_PARTITIONS = 12
KAFKA_BINDING_VERSION = "0.5.0"
AUDIT_SCHEMA_PATH = "events/audit.json"
MANIFEST_SCHEMA_PATH = "manifest.json"
ENVELOPE_SCHEMA_PATH = "envelope.json"
ASYNCAPI_PATH = "asyncapi.yaml"
#: The command that writes the files, named in their headers.
GENERATOR = "toolfleet.cli.schemas"


@dataclass(frozen=True, slots=True, kw_only=True)
class EventDoc:
    """What the contract says about one event type's ``data``."""

    model: type[BaseModel]
    description: str


EVENTS: dict[EventType, EventDoc] = {
    EventType.INVOKE_REQUESTED: EventDoc(
        model=InvokeRequested,
        description="An agent asks for a tool call (contract section 2). Written by producers "
        "(SDK, CLI, HTTP API). agent_context.tenant_id must equal the tenantid attribute "
        "and the Kafka key. Unknown fields are rejected.",
    ),
    EventType.INVOKE_AUTHORIZED: EventDoc(
        model=InvokeAuthorized,
        description="Policy allowed the call and resolved the version; the capability token "
        "is dropped. Written by policy, read by the executor.",
    ),
    EventType.INVOKE_EXECUTED: EventDoc(
        model=InvokeExecuted,
        description="The tool returned; the result is raw and unvalidated. Written by the "
        "executor, read by the validator.",
    ),
    EventType.SUCCEEDED: EventDoc(
        model=ToolOutcome,
        description="Terminal outcome: the tool succeeded and its result passed validation "
        "and redaction (contract section 3).",
    ),
    EventType.FAILED: EventDoc(
        model=ToolOutcome,
        description="Terminal outcome: the invocation failed or was denied; error.code says "
        "why (contract section 3).",
    ),
    EventType.TIMEOUT: EventDoc(
        model=ToolOutcome,
        description="Terminal outcome: the tool ran out of time (contract section 3).",
    ),
    EventType.CANCELLED: EventDoc(
        model=ToolOutcome,
        description="Terminal outcome: the invocation was cancelled (contract section 3).",
    ),
    EventType.INVOKE_QUEUED: EventDoc(
        model=InvokeQueued,
        description="The call waits for an executor of its pool: none was live when policy "
        "authorized it (written by policy), or the executor of the pool that read it lacks "
        "the tool and no live one has it (written by that executor). Its status is queued "
        "until an executor starts it, or it ends timeout at its deadline.",
    ),
    EventType.INVOKED: EventDoc(
        model=ToolInvoked,
        description="An executor started running the tool (once per attempt).",
    ),
    EventType.CHECKPOINT_CREATED: EventDoc(
        model=CheckpointCreated,
        description="A running tool saved a checkpoint; the state itself stays in Redis "
        "under checkpoint:tool:{<tenant_id>}:<invocation_id>:latest.",
    ),
    EventType.APPROVAL_REQUESTED: EventDoc(
        model=ApprovalRequested,
        description="The call waits for a human to approve or deny it.",
    ),
    EventType.CONTROL_REFUSED: EventDoc(
        model=ControlRefused,
        description="Policy refused a control event it could not trust (unsigned, forged, "
        "expired or bound to other fields); the call it named is unchanged.",
    ),
    EventType.OUTCOME_REFUSED: EventDoc(
        model=OutcomeRefused,
        description="Status or policy ignored an outcome it could not trust (unsigned, "
        "forged, or signed for another call); the call it named is unchanged.",
    ),
    EventType.EGRESS: EventDoc(
        model=EgressDecided,
        description="The sandbox egress proxy allowed or refused a connection of an "
        "isolated tool (host, port, method, decision, reason; never a header or a body).",
    ),
    EventType.CIRCUIT_OPENED: EventDoc(
        model=CircuitChanged,
        description="A circuit breaker opened: calls through it fail fast with "
        "circuit_breaker_open until it closes.",
    ),
    EventType.CIRCUIT_CLOSED: EventDoc(
        model=CircuitChanged,
        description="A circuit breaker closed again.",
    ),
    EventType.TOOL_LIFECYCLE_CHANGED: EventDoc(
        model=ToolLifecycleChanged,
        description="An operator moved a tool version along its lifecycle (deprecated, "
        "sunset, removed). Written by the API; audit records the operator.",
    ),
    EventType.SOURCE_TOOL_ADDED: EventDoc(
        model=SourceToolAdded,
        description="A tool source added a tool at run time (tools/list_changed): it is "
        "registered but disabled until a policy names it.",
    ),
    EventType.CANCEL_REQUESTED: EventDoc(
        model=CancelRequested,
        description="Someone asks to cancel an invocation. Written by the API, CLI or SDK.",
    ),
    EventType.APPROVAL_GRANTED: EventDoc(
        model=ApprovalDecision,
        description="A human approved an invocation waiting in pending_approval.",
    ),
    EventType.APPROVAL_DENIED: EventDoc(
        model=ApprovalDecision,
        description="A human denied an invocation waiting in pending_approval; it ends "
        "with approval_denied.",
    ),
    EventType.DLQ_RECORD: EventDoc(
        model=DlqRecord,
        description="A message a consumer could not decode or process: original key, "
        "headers and value (base64), where it came from and the error.",
    ),
    EventType.ANOMALY: EventDoc(
        model=AnomalyDetected,
        description="A detector of the analytics app found an anomaly in the audit stream "
        "(a denial spike for an agent, a tool's error-rate jump, an agent calling tools it "
        "never called before at a high rate). On the audit topic in structured mode, with "
        "an OCSF 1.8 Detection Finding (class 2004) projection in the ocsf member.",
    ),
}

AUDIT_DOC = EventDoc(
    model=AuditRecord,
    description="data of an event on the audit topic: one per lifecycle event, with the "
    "same type. Parameters are PII-sanitized; never a secret or a token. The ocsf member "
    "holds the OCSF 1.8 API Activity (class 6003) projection of the same fact.",
)

#: CloudEvents attributes of the envelope, as the contract (section 1) defines them.
ATTRIBUTE_DOCS: dict[str, str] = {
    "id": "Event id, new for every event a stage emits. source + id identify an event: "
    "a redelivered or re-sent event with the same pair is processed once.",
    "source": "Stable URI of the emitting service, e.g. /toolfleet/policy.",
    "type": "Event type, e.g. ai.agent.tool.invoke.requested.",
    "specversion": "CloudEvents specification version.",
    "time": "When the event was produced (RFC 3339).",
    "subject": "The invocation id, where there is one.",
    "datacontenttype": "Content type of data; toolfleet data is always a JSON object.",
    "tenantid": "Extension: the tenant. Equals the Kafka message key.",
    "invocationid": "Extension: the invocation this event belongs to, where there is one.",
    "partitionkey": "Extension (partitioning): the tenant id, used as the Kafka key.",
    "traceparent": "Extension (distributed tracing): W3C trace context of the original "
    "request, so one invocation is one trace across all services.",
    "tracestate": "Extension (distributed tracing): W3C tracestate.",
    "authtype": "Extension (authcontext): principal type, set once policy verified the "
    "capability token (which never travels further).",
    "authid": "Extension (authcontext): principal id, set once policy verified the token.",
    "data": "The event data, a JSON object (see the schema of each event type).",
}

#: Which topic each channel is, with the contract's description of it.
TOPIC_DOCS: dict[TopicName, str] = {
    TopicName.REQUESTED: "Invoke requests. Written by producers (SDK, CLI, HTTP API).",
    TopicName.AUTHORIZED: "Requests policy allowed, with the version resolved and the token "
    "removed. Written by policy.",
    TopicName.EXECUTED: "Raw, unvalidated tool results. Written by the executor.",
    TopicName.RESULTS: "Terminal outcomes; every invocation ends in exactly one. Written by "
    "the validator, policy and the executor.",
    TopicName.EVENTS: "Lifecycle notifications: execution started, checkpoints, approval "
    "requests, refused control events, circuit changes. Written by any service.",
    TopicName.CONTROL: "Cancellation and approval decisions, each signed by the API, CLI or "
    "SDK that checked the decider (data.signature). Written by the API, CLI and SDK.",
    TopicName.AUDIT: "One audit event per lifecycle event, for SIEMs: same type, data "
    "with the audit fields plus an OCSF 1.8 API Activity (6003) projection. Written by the "
    "audit service; the analytics app adds ai.agent.tool.anomaly findings (OCSF Detection "
    "Finding, 2004).",
    TopicName.DLQ: "Messages a consumer could not decode or process. Written by any consumer.",
}

STRUCTURED_TOPICS = frozenset({TopicName.AUDIT, TopicName.DLQ})

#: The channel of every executor pool's topic but the default pool's.
POOL_CHANNEL = "invokeAuthorizedPool"
POOL_CHANNEL_DOC = (
    "The topic of executor pool {pool}: requests policy allowed for a tool whose manifest "
    "names that pool (tools of the default pool stay on invoke.authorized). Read by the "
    "executors started with --pool {pool} (consumer group executor.{pool}) and by the "
    "observers (a pattern subscription); an executor that lacks a call's tool hands it to "
    "a partition of one that has it. Created with the configuration of invoke.authorized."
)

_TERMINAL_STATUSES: dict[EventType, list[str]] = {}
for _status, _type in _TYPE_OF_STATUS.items():
    _TERMINAL_STATUSES.setdefault(_type, []).append(_status.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One party's use of one topic, as the AsyncAPI document lists it."""

    service: str
    action: str  # "send" | "receive"
    route: Route


def operations() -> list[Operation]:
    """Every operation of the routing table (:mod:`toolfleet.events.routing`)."""
    ops: list[Operation] = []
    for party in ROUTING:
        ops.extend(Operation(service=party.name, action="receive", route=r) for r in party.reads)
        ops.extend(Operation(service=party.name, action="send", route=r) for r in party.sends)
        if party.dead_letters:
            ops.append(Operation(service=party.name, action="send", route=DEAD_LETTER))
    return ops


# --- JSON Schema ------------------------------------------------------------------------


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    # Field descriptions are the attribute docstrings (``use_attribute_docstrings`` in the
    # models' config).
    return model.model_json_schema(mode="validation")


def _schema_file(path: str, title: str, description: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in body.items() if k not in {"title", "description"}}
    return {
        "$schema": DRAFT_2020_12,
        "$id": SCHEMA_BASE_URI + path,
        "title": title,
        "description": description,
        **body,
    }


def event_schema_path(event_type: EventType) -> str:
    """Relative path of the schema of ``event_type``'s ``data``."""
    return f"events/{event_type.value}.json"


def event_schema(event_type: EventType) -> dict[str, Any]:
    """JSON Schema of the ``data`` of ``event_type``."""
    doc = EVENTS[event_type]
    body = _model_schema(doc.model)
    statuses = _TERMINAL_STATUSES.get(event_type)
    if statuses:
        # One model serves four types; each type allows only its own statuses.
        body["properties"]["status"] = {
            "$ref": "#/$defs/InvocationStatus",
            "enum": sorted(statuses),
            "description": f"One of {', '.join(sorted(statuses))} for {event_type.value}.",
        }
    description = f"data of {event_type.value} events ({doc.model.__name__}). {doc.description}"
    return _schema_file(event_schema_path(event_type), event_type.value, description, body)


def audit_schema() -> dict[str, Any]:
    body = _model_schema(AUDIT_DOC.model)
    return _schema_file(AUDIT_SCHEMA_PATH, "toolfleet audit record", AUDIT_DOC.description, body)


def manifest_schema() -> dict[str, Any]:
    """A tool version's manifest, as ``GET /v1/tools/{id}`` serves it."""
    # Imported here: the registry builds on the event models, not the other way round.

    return _schema_file(
        MANIFEST_SCHEMA_PATH,
        "toolfleet tool manifest",
        "One version of one tool: schemas, effect, permissions, retry and circuit settings, "
        "approval, resource defaults, source type, category and tags, and its lifecycle.",
        _model_schema(ToolManifest),
    )


def envelope_schema() -> dict[str, Any]:
    """The CloudEvent envelope (structured-mode JSON) every toolfleet event has."""
    generated = _model_schema(Envelope)
    properties: dict[str, Any] = {}
    for name, prop in generated["properties"].items():
        prop = _drop_null(prop)
        prop.pop("title", None)
        prop.pop("default", None)
        prop["description"] = ATTRIBUTE_DOCS[name]
        properties[name] = prop
    properties["specversion"] = {"const": "1.0", "description": ATTRIBUTE_DOCS["specversion"]}
    properties["type"]["enum"] = sorted(t.value for t in EventType)
    properties["traceparent"]["pattern"] = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
    return _schema_file(
        ENVELOPE_SCHEMA_PATH,
        "toolfleet CloudEvent",
        "A CloudEvents 1.0 event as toolfleet emits and accepts it (structured content "
        "mode: the whole event as JSON). In binary mode the same attributes travel as "
        "ce_<name> Kafka headers and the value is data. toolfleet always sets tenantid and "
        "partitionkey (= the Kafka key), and invocationid/subject where there is an "
        "invocation; authtype/authid appear once policy verified the capability token. "
        "Extension attributes toolfleet does not know are legal and ignored.",
        {
            "type": "object",
            "properties": properties,
            "required": ["id", "source", "specversion", "type"],
            "propertyNames": {"pattern": "^[a-z0-9]+$"},
        },
    )


def _drop_null(prop: dict[str, Any]) -> dict[str, Any]:
    """``X | None`` -> ``X``: an absent CloudEvents attribute is omitted, never null."""
    options = prop.get("anyOf")
    if options is None:
        return dict(prop)
    kept = [o for o in options if o != {"type": "null"}]
    rest = {k: v for k, v in prop.items() if k != "anyOf"}
    return {**rest, **kept[0]} if len(kept) == 1 else {**rest, "anyOf": kept}


# --- AsyncAPI -------------------------------------------------------------------------


def _camel(text: str) -> str:
    words = text.replace(".", "_").lower().split("_")
    return words[0] + "".join(w.capitalize() for w in words[1:])


def _channel_id(name: TopicName) -> str:
    return _camel(name.value)


def _message_id(event_type: EventType) -> str:
    return _camel(event_type.name)


def _binary_headers(event_type: EventType) -> dict[str, Any]:
    return {
        "allOf": [
            {"$ref": "#/components/schemas/binaryModeHeaders"},
            {"properties": {"ce_type": {"const": event_type.value}}},
        ]
    }


def _binary_headers_schema() -> dict[str, Any]:
    envelope = envelope_schema()["properties"]
    headers: dict[str, Any] = {
        f"ce_{name}": {"type": "string", "description": doc}
        for name, doc in ATTRIBUTE_DOCS.items()
        if name not in {"data", "datacontenttype"}
    }
    headers["ce_specversion"]["const"] = "1.0"
    headers["ce_type"]["enum"] = envelope["type"]["enum"]
    headers["content-type"] = {
        "type": "string",
        "const": "application/json",
        "description": "Content type of the value (the data); the datacontenttype attribute.",
    }
    return {
        "type": "object",
        "description": "Binary content mode (CloudEvents Kafka binding): every attribute is "
        "a ce_<name> header (UTF-8), the value is data as JSON. toolfleet emits this mode on "
        "the pipeline topics so events can be routed by headers without parsing the value.",
        "properties": headers,
        "required": ["ce_id", "ce_source", "ce_specversion", "ce_type"],
    }


def _structured_payload(data_ref: str, types: Sequence[str]) -> dict[str, Any]:
    type_schema: dict[str, Any] = {"enum": list(types)} if len(types) > 1 else {"const": types[0]}
    return {
        "allOf": [
            {"$ref": f"./{ENVELOPE_SCHEMA_PATH}"},
            {
                "type": "object",
                "properties": {"type": type_schema, "data": {"$ref": f"./{data_ref}"}},
                "required": ["data"],
            },
        ]
    }


TENANT_KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": TENANT_ID_PATTERN,
    "description": "The tenant id (UTF-8). Partitions by tenant; equals the tenantid and "
    "partitionkey attributes.",
}
ORIGINAL_KEY_SCHEMA: dict[str, Any] = {
    "type": ["string", "null"],
    "description": "The key of the dead-lettered message (normally its tenant id), unchanged.",
}


def _kafka_message_binding(key: dict[str, Any]) -> dict[str, Any]:
    # Inline, not a $ref: the binding's ``key`` is oneOf [Reference, Schema], which a
    # bare $ref satisfies twice, so validators of the AsyncAPI document reject it.
    return {"kafka": {"key": dict(key), "bindingVersion": KAFKA_BINDING_VERSION}}


def _messages() -> dict[str, Any]:
    messages: dict[str, Any] = {}
    for event_type, doc in EVENTS.items():
        if TOPIC_OF_TYPE[event_type] in STRUCTURED_TOPICS:
            continue
        messages[_message_id(event_type)] = {
            "name": event_type.value,
            "title": event_type.value,
            "summary": (inspect.getdoc(doc.model) or "").split("\n")[0],
            "description": doc.description,
            "contentType": "application/json",
            "headers": _binary_headers(event_type),
            "payload": {"$ref": f"./{event_schema_path(event_type)}"},
            "correlationId": {"$ref": "#/components/correlationIds/invocationIdHeader"},
            "bindings": _kafka_message_binding(TENANT_KEY_SCHEMA),
            "x-cloudevents-content-mode": "binary",
        }
    lifecycle_types = sorted(
        t.value for t, name in TOPIC_OF_TYPE.items() if name in LIFECYCLE_TOPICS
    )
    messages["auditRecord"] = {
        "name": "audit",
        "title": "audit event",
        "summary": "One audit event per lifecycle event, with the same type.",
        "description": AUDIT_DOC.description,
        "contentType": STRUCTURED_CONTENT_TYPE,
        "headers": {"$ref": "#/components/schemas/structuredModeHeaders"},
        "payload": _structured_payload(AUDIT_SCHEMA_PATH, lifecycle_types),
        "correlationId": {"$ref": "#/components/correlationIds/invocationIdPayload"},
        "bindings": _kafka_message_binding(TENANT_KEY_SCHEMA),
        "x-cloudevents-content-mode": "structured",
    }
    dlq = EVENTS[EventType.DLQ_RECORD]
    messages[_message_id(EventType.DLQ_RECORD)] = {
        "name": EventType.DLQ_RECORD.value,
        "title": EventType.DLQ_RECORD.value,
        "summary": (inspect.getdoc(dlq.model) or "").split("\n")[0],
        "description": dlq.description,
        "contentType": STRUCTURED_CONTENT_TYPE,
        "headers": {"$ref": "#/components/schemas/structuredModeHeaders"},
        "payload": _structured_payload(
            event_schema_path(EventType.DLQ_RECORD), [EventType.DLQ_RECORD.value]
        ),
        "bindings": _kafka_message_binding(ORIGINAL_KEY_SCHEMA),
        "x-cloudevents-content-mode": "structured",
    }
    anomaly = EVENTS[EventType.ANOMALY]
    messages[_message_id(EventType.ANOMALY)] = {
        "name": EventType.ANOMALY.value,
        "title": EventType.ANOMALY.value,
        "summary": (inspect.getdoc(anomaly.model) or "").split("\n")[0],
        "description": anomaly.description,
        "contentType": STRUCTURED_CONTENT_TYPE,
        "headers": {"$ref": "#/components/schemas/structuredModeHeaders"},
        "payload": _structured_payload(
            event_schema_path(EventType.ANOMALY), [EventType.ANOMALY.value]
        ),
        "bindings": _kafka_message_binding(TENANT_KEY_SCHEMA),
        "x-cloudevents-content-mode": "structured",
    }
    return messages


def _channel_messages(name: TopicName) -> list[str]:
    if name is TopicName.AUDIT:
        return ["auditRecord", _message_id(EventType.ANOMALY)]
    return [_message_id(t) for t in types_on(name)]


def _channels() -> dict[str, Any]:
    channels: dict[str, Any] = {}
    for name in TopicName:
        address = f"{DEFAULT_TOPIC_PREFIX}{name.value}"
        if name in STRUCTURED_TOPICS:
            mode = (
                f"Emitted in structured content mode (content-type {STRUCTURED_CONTENT_TYPE}: "
                "the whole event is the value)."
            )
        else:
            mode = (
                "Emitted in binary content mode (ce_* headers, data as the value); "
                f"structured mode ({STRUCTURED_CONTENT_TYPE}) is accepted too, the "
                "decoder being chosen by content-type."
            )
        channels[_channel_id(name)] = {
            "address": address,
            "title": address,
            "description": f"{TOPIC_DOCS[name]} {mode} Key: the tenant id; the prefix "
            f"{DEFAULT_TOPIC_PREFIX!r} is configurable (TOOLFLEET_TOPIC_PREFIX).",
            "messages": {
                mid: {"$ref": f"#/components/messages/{mid}"} for mid in _channel_messages(name)
            },
            "bindings": {
                "kafka": {
                    "topic": address,
                    "partitions": DEFAULT_PARTITIONS,
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            },
        }
    authorized = channels[_channel_id(TopicName.AUTHORIZED)]
    address = f"{authorized['address']}.{{pool}}"
    channels[POOL_CHANNEL] = {
        "address": address,
        "title": address,
        "description": f"{POOL_CHANNEL_DOC} Binary content mode, as invoke.authorized. Key: "
        f"the tenant id; the prefix {DEFAULT_TOPIC_PREFIX!r} is configurable "
        "(TOOLFLEET_TOPIC_PREFIX).",
        "parameters": {
            "pool": {
                "description": f"The pool's name ({POOL_NAME_PATTERN}), from the tool's "
                "manifest; never from the request.",
                "examples": ["gpu", "acme"],
            }
        },
        "messages": dict(authorized["messages"]),
        "bindings": {
            "kafka": {"partitions": DEFAULT_PARTITIONS, "bindingVersion": KAFKA_BINDING_VERSION}
        },
    }
    return channels


def _operations_doc() -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for op in operations():
        route = op.route
        channel = _channel_id(route.topic)
        # An untyped route is the audit topic's one message for every lifecycle type.
        mids = [_message_id(t) for t in route.types] or _channel_messages(route.topic)[:1]
        op_id = f"{op.service}{op.action.capitalize()}{channel[0].upper()}{channel[1:]}"
        doc[op_id] = {
            "action": op.action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": route.summary,
            "tags": [{"name": op.service}],
            "messages": [{"$ref": f"#/channels/{channel}/messages/{mid}"} for mid in mids],
        }
        if route.pools:
            doc[f"{op_id}Pools"] = {
                **doc[op_id],
                "channel": {"$ref": f"#/channels/{POOL_CHANNEL}"},
                "messages": [{"$ref": f"#/channels/{POOL_CHANNEL}/messages/{mid}"} for mid in mids],
            }
    return doc


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of every topic, message and service operation."""
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "toolfleet",
            "version": CONTRACT_VERSION,
            "description": "Event-driven tool execution for AI agents over Kafka. Every "
            "message is a CloudEvents 1.0 event (Kafka protocol binding), keyed by tenant "
            "id. Generated from the pydantic models by toolfleet.contract.schema_export; "
            "do not edit by hand.",
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "servers": {
            "dev": {
                "host": "127.0.0.1:9092",
                "protocol": "kafka",
                "description": "Local development broker (toolfleet dev).",
            },
            "prod": {
                "host": "{bootstrap}",
                "protocol": "kafka",
                "description": "Production cluster (TOOLFLEET_KAFKA_BOOTSTRAP).",
                "variables": {
                    "bootstrap": {
                        "default": "kafka:9092",
                        "description": "A host:port of the cluster's bootstrap servers.",
                    }
                },
            },
        },
        "channels": _channels(),
        "operations": _operations_doc(),
        "components": {
            "messages": _messages(),
            "schemas": {
                "binaryModeHeaders": _binary_headers_schema(),
                "structuredModeHeaders": {
                    "type": "object",
                    "description": "Structured content mode: the whole CloudEvent is the "
                    "value; SIEM connectors need only the value.",
                    "properties": {
                        "content-type": {"type": "string", "const": STRUCTURED_CONTENT_TYPE}
                    },
                    "required": ["content-type"],
                },
            },
            "correlationIds": {
                "invocationIdHeader": {
                    "description": "The invocation an event belongs to.",
                    "location": "$message.header#/ce_invocationid",
                },
                "invocationIdPayload": {
                    "description": "The invocation an event belongs to.",
                    "location": "$message.payload#/invocationid",
                },
            },
        },
    }


# --- rendering ----------------------------------------------------------------------------


def _json_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated sub-documents out in full: anchors would hide them from readers."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _yaml_text(document: dict[str, Any]) -> str:
    header = f"# Generated by `python -m {GENERATOR}`; do not edit.\n"
    body = yaml.dump(document, Dumper=_NoAliasDumper, sort_keys=True, allow_unicode=True, width=100)
    return header + body


def render() -> dict[str, str]:
    """Every file of ``schemas/``: relative path -> text."""
    files = {event_schema_path(t): _json_text(event_schema(t)) for t in EventType}
    files[AUDIT_SCHEMA_PATH] = _json_text(audit_schema())
    files[ENVELOPE_SCHEMA_PATH] = _json_text(envelope_schema())
    files[MANIFEST_SCHEMA_PATH] = _json_text(manifest_schema())
    files[ASYNCAPI_PATH] = _yaml_text(asyncapi_document())
    return dict(sorted(files.items()))
