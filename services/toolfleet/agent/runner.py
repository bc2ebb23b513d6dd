"""``ToolRunner``: runs the tool calls of a model's turns through the fleet, for one run.

Per turn, every call gets a deterministic id (run id, turn, index, tool, canonical
arguments) that is also its idempotency key, so a crashed loop that is run again finds
the calls it already made instead of running them twice. Calls the runner can answer
itself never reach the fleet: a tool outside the run's catalog is ``permission_denied``,
arguments that are not JSON or fail the input schema are ``invalid_parameters`` (the
model reads why and may correct the call on its next turn), and a call past a guard
rail (``max_tool_calls``, the runtime or result-bytes budget) is ``resource_exhausted``,
not retryable (no retry within the run can pass its limit), naming the limit in its
message and in ``details["limit"]``.
The rest run in parallel; a call waiting for a human is announced as
``approval_pending`` and simply awaited. A call whose outcome is an earlier run's (its
idempotency key found the first execution, which started before this run submitted it)
has ``deduplicated`` set on its envelope: it did not run again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from toolfleet.agent.adapters import parse_call
from toolfleet.agent.catalog import RunCatalog
from toolfleet.agent.port import FleetEvent, FleetEventKind, FleetPort, Submission
from toolfleet.agent.records import (
    AgentEvent,
    EventKind,
    ToolCall,
    ToolEnvelope,
    call_id,
    canonical_json,
)
from toolfleet.errors import (
    ErrorInfo,
    InvalidParameters,
    PermissionDenied,
    ResourceExhausted,
    ToolfleetError,
    ToolTimeout,
)
from toolfleet.events.models import Effect, ToolOutcome

__all__ = ["PIN_KEY", "AgentRunLimits", "Clock", "RunLimitReached", "ToolRunner"]

Clock = Callable[[], datetime]
PIN_KEY = "$pinned"
"""An argument value ``{"$pinned": "name"}`` is replaced by the result pinned as ``name``
(``{"$pinned": "name", "field": "f"}``: by that field of it)."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RunLimitReached(ResourceExhausted):
    """A call past one of the run's guard rails: ``resource_exhausted``, but unlike the
    fleet's (a rate or a quota that frees up), retrying within this run cannot pass it."""

    retryable = False


def _limit_reached(limit: str, message: str) -> RunLimitReached:
    return RunLimitReached(message, details={"limit": limit})


@dataclass(frozen=True, kw_only=True)
class AgentRunLimits:
    """Guard rails of one run."""

    max_iterations: int = 10
    """Model turns before the loop stops (``run_agent``)."""
    max_tool_calls: int = 64
    """Calls of the whole run; later ones are refused with ``resource_exhausted``
    (not retryable)."""
    max_runtime_ms: int | None = None
    """Tool runtime of the whole run (sum of the outcomes' ``duration_ms``)."""
    max_result_bytes: int | None = None
    """Result bytes of the whole run (canonical JSON of each result)."""
    denied_effects: frozenset[Effect] = frozenset()
    """Effects this run may not use (``{external_side_effect}``: a read-only agent)."""
    call_timeout_s: float = 3600
    """How long one call is awaited, approvals included."""


@dataclass
class _Usage:
    calls: int = 0
    runtime_ms: int = 0
    result_bytes: int = 0


@dataclass(kw_only=True)
class ToolRunner:
    """Runs one agent run's tool calls. Build it with :meth:`open`."""

    fleet: FleetPort
    catalog: RunCatalog
    run_id: str
    limits: AgentRunLimits = field(default_factory=AgentRunLimits)
    clock: Clock = _utc_now
    tools_by_id: dict[str, ToolEnvelope] = field(default_factory=dict)
    """Every finished call, by call id."""
    tool_order: list[str] = field(default_factory=list)
    """Call ids in the order the model asked for them."""
    pinned: dict[str, str] = field(default_factory=dict)
    """Pinned handles: name to call id."""
    events: list[AgentEvent] = field(default_factory=list)
    """The run's event stream so far."""
    _listeners: list[Callable[[AgentEvent], None]] = field(default_factory=list)
    _usage: _Usage = field(default_factory=_Usage)
    _next_turn: int = 0

    @classmethod
    async def open(
        cls,
        fleet: FleetPort,
        *,
        run_id: str,
        limits: AgentRunLimits | None = None,
        strict: bool = False,
        skip_unsafe: bool = False,
        clock: Clock = _utc_now,
    ) -> ToolRunner:
        """Read the fleet's policy-filtered catalog and compile it, once, for this run.

        A tool whose schema cannot be made provider-safe fails the run's start with a
        :class:`~toolfleet.errors.ProviderSchemaError`, or with ``skip_unsafe`` is left
        out of the catalog (listed in ``catalog.refused``).
        """
        limits = limits or AgentRunLimits()
        catalog = RunCatalog.compile(
            await fleet.catalog(),
            denied_effects=limits.denied_effects,
            strict=strict,
            skip_unsafe=skip_unsafe,
        )
        return cls(fleet=fleet, catalog=catalog, run_id=run_id, limits=limits, clock=clock)

    # --- outputs ---------------------------------------------------------------------

    @property
    def last_tool(self) -> ToolEnvelope | None:
        return self.tools_by_id[self.tool_order[-1]] if self.tool_order else None

    def subscribe(self, listener: Callable[[AgentEvent], None]) -> None:
        """Hear every event of the run as it happens (a UI, an SSE bridge)."""
        self._listeners.append(listener)

    def pin(self, name: str, call_id_: str) -> None:
        """Keep a call's result under ``name``: later calls pass ``{"$pinned": name}``."""
        if call_id_ not in self.tools_by_id:
            raise KeyError(f"no call {call_id_!r} in this run")
        self.pinned[name] = call_id_

    # --- running ---------------------------------------------------------------------

    async def run_turn(self, turn: int, calls: Sequence[ToolCall]) -> list[ToolEnvelope]:
        """Run one model turn's calls (in parallel); envelopes in the calls' order."""
        self._next_turn = max(self._next_turn, turn + 1)
        jobs = []
        for index, call in enumerate(calls):
            self._usage.calls += 1
            jobs.append(self._one(turn, index, call, over_limit=self._over_call_limit()))
        envelopes = list(await asyncio.gather(*jobs))
        for envelope in envelopes:
            self.tools_by_id[envelope.call_id] = envelope
            self.tool_order.append(envelope.call_id)
        return envelopes

    async def call(
        self, tool: str, arguments: Mapping[str, Any] | str, *, provider_call_id: str = ""
    ) -> ToolEnvelope:
        """One call outside a model turn (a framework's tool wrapper): it is a turn of
        its own, numbered after the run's last, so its id stays deterministic."""
        turn = self._next_turn
        self._next_turn += 1
        call = parse_call(provider_call_id or f"call_{turn}", tool, arguments)
        (envelope,) = await self.run_turn(turn, [call])
        return envelope

    def _over_call_limit(self) -> bool:
        return self._usage.calls > self.limits.max_tool_calls

    async def _one(
        self, turn: int, index: int, call: ToolCall, *, over_limit: bool
    ) -> ToolEnvelope:
        arguments: Any = call.arguments if call.arguments is not None else call.raw_arguments
        cid = call_id(
            run_id=self.run_id, turn=turn, index=index, tool=call.tool, arguments=arguments
        )
        started = self.clock()
        refusal = self._refusal(call, over_limit)
        resolved: dict[str, Any] | None = None
        if refusal is None:
            try:
                resolved = self._resolve_pins(call.arguments or {})
            except InvalidParameters as exc:
                refusal = exc
        if refusal is None and resolved is not None:
            errors = self.catalog.argument_errors(call.tool, resolved)
            if errors:
                refusal = InvalidParameters(
                    f"the arguments do not match the input schema of {call.tool}",
                    details={"errors": errors},
                )
        if refusal is not None or resolved is None:
            return self._reported(self._refused(cid, turn, index, call, started, refusal, resolved))
        return await self._submit(cid, turn, index, call, resolved, started)

    def _refusal(self, call: ToolCall, over_limit: bool) -> ToolfleetError | None:
        tool = self.catalog.get(call.tool)
        if tool is None:
            return PermissionDenied(f"tool {call.tool!r} is not in this run's catalog")
        if call.decode_error is not None:
            return InvalidParameters(call.decode_error)
        if over_limit:
            return _limit_reached(
                "max_tool_calls",
                f"this run reached max_tool_calls ({self.limits.max_tool_calls})",
            )
        budget = self.limits
        if budget.max_runtime_ms is not None and self._usage.runtime_ms >= budget.max_runtime_ms:
            return _limit_reached(
                "max_runtime_ms",
                f"this run spent its runtime budget (max_runtime_ms {budget.max_runtime_ms})",
            )
        if (
            budget.max_result_bytes is not None
            and self._usage.result_bytes >= budget.max_result_bytes
        ):
            return _limit_reached(
                "max_result_bytes",
                f"this run spent its result budget (max_result_bytes {budget.max_result_bytes})",
            )
        return None

    def _resolve_pins(self, value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) <= {PIN_KEY, "field"} and isinstance(value.get(PIN_KEY), str):
                return self._pinned_value(value[PIN_KEY], value.get("field"))
            return {k: self._resolve_pins(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve_pins(v) for v in value]
        return value

    def _pinned_value(self, name: str, field_: Any) -> Any:
        cid = self.pinned.get(name)
        envelope = self.tools_by_id.get(cid) if cid else None
        if envelope is None or envelope.output is None:
            raise InvalidParameters(f"no pinned result named {name!r}")
        if field_ is None:
            return envelope.output
        if not isinstance(field_, str) or field_ not in envelope.output:
            raise InvalidParameters(f"the pinned result {name!r} has no field {field_!r}")
        return envelope.output[field_]

    def _refused(
        self,
        cid: str,
        turn: int,
        index: int,
        call: ToolCall,
        started: datetime,
        error: ToolfleetError | None,
        resolved: dict[str, Any] | None,
    ) -> ToolEnvelope:
        info = (error or InvalidParameters("the call was refused")).to_error_info()
        status = "permission_denied" if info.code.value == "permission_denied" else "error"
        tool = self.catalog.get(call.tool)
        return ToolEnvelope(
            call_id=cid,
            provider_call_id=call.provider_call_id,
            turn=turn,
            index=index,
            tool=call.tool,
            version=tool.manifest.version if tool else None,
            input=resolved if resolved is not None else call.arguments,
            status=status,
            error=info,
            started_at=started,
            ended_at=self.clock(),
        )

    def _reported(self, envelope: ToolEnvelope) -> ToolEnvelope:
        """``envelope`` (of a call that never ran), reported as the call's result."""
        self._emit(
            AgentEvent(
                kind=EventKind.TOOL_CALL_RESULT,
                call_id=envelope.call_id,
                tool=envelope.tool,
                turn=envelope.turn,
                envelope=envelope,
            )
        )
        return envelope

    async def _submit(
        self,
        cid: str,
        turn: int,
        index: int,
        call: ToolCall,
        arguments: dict[str, Any],
        started: datetime,
    ) -> ToolEnvelope:
        tool = self.catalog.get(call.tool)
        assert tool is not None  # checked by _refusal
        try:
            submitted = await self.fleet.submit(
                Submission(
                    tool_id=call.tool,
                    tool_version=tool.manifest.version,
                    parameters=arguments,
                    idempotency_key=cid,
                    session_id=self.run_id,
                )
            )
        except ToolfleetError as exc:
            # The fleet refused or could not take the call: the model reads why (a
            # retryable error may succeed when the run, or the same call, is tried again).
            return self._reported(self._refused(cid, turn, index, call, started, exc, arguments))
        base = {"call_id": cid, "tool": call.tool, "turn": turn}
        self._emit(
            AgentEvent(
                kind=EventKind.TOOL_CALL_START, invocation_id=submitted.invocation_id, **base
            )
        )

        def heard(event: FleetEvent) -> None:
            if event.kind is FleetEventKind.APPROVAL_REQUESTED:
                kind = EventKind.APPROVAL_PENDING
            elif event.kind is FleetEventKind.PROGRESS:
                kind = EventKind.PROGRESS
            else:
                return
            self._emit(
                AgentEvent(
                    kind=kind,
                    invocation_id=event.invocation_id,
                    progress_percent=event.progress_percent,
                    current_phase=event.current_phase,
                    **base,
                )
            )

        try:
            outcome = await self.fleet.outcome(
                submitted, on_event=heard, timeout=self.limits.call_timeout_s
            )
        except TimeoutError:
            # The call may still end; its idempotency key finds that outcome on a re-run.
            envelope = self._refused(
                cid,
                turn,
                index,
                call,
                started,
                ToolTimeout(
                    f"no outcome within call_timeout_s ({self.limits.call_timeout_s:g} s); "
                    "the call may still finish"
                ),
                arguments,
            )
            envelope = envelope.model_copy(
                update={"invocation_id": submitted.invocation_id, "status": "timeout"}
            )
        else:
            envelope = self._envelope(cid, turn, index, call, arguments, started, outcome)
        envelope = envelope.model_copy(update={"trace_id": submitted.trace_id})
        self._usage.runtime_ms += envelope.runtime_ms
        self._usage.result_bytes += envelope.result_bytes
        self._emit(
            AgentEvent(
                kind=EventKind.TOOL_CALL_RESULT,
                invocation_id=submitted.invocation_id,
                envelope=envelope,
                **base,
            )
        )
        return envelope

    def _envelope(
        self,
        cid: str,
        turn: int,
        index: int,
        call: ToolCall,
        arguments: dict[str, Any],
        started: datetime,
        outcome: ToolOutcome,
    ) -> ToolEnvelope:
        meta = outcome.execution_metadata
        error: ErrorInfo | None = outcome.error
        return ToolEnvelope(
            call_id=cid,
            provider_call_id=call.provider_call_id,
            turn=turn,
            index=index,
            tool=call.tool,
            version=outcome.tool_version,
            input=arguments,
            status=outcome.status.value,
            output=outcome.result,
            error=error,
            started_at=meta.started_at or started,
            ended_at=meta.completed_at or self.clock(),
            cached=meta.cached,
            deduplicated=meta.started_at is not None and meta.started_at < started,
            truncated=meta.truncated,
            attachments=[a.url for a in meta.attachments],
            invocation_id=str(outcome.invocation_id),
            runtime_ms=meta.duration_ms,
            result_bytes=len(canonical_json(outcome.result).encode()) if outcome.result else 0,
        )

    def _emit(self, event: AgentEvent) -> None:
        self.events.append(event)
        for listener in self._listeners:
            listener(event)
