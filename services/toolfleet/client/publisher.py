"""``KafkaPublisher``: the fleet's own producer on the broker. Publishes invokes and
control events for any tenant, waits for outcomes (needs the ``fleet`` extra: aiokafka
and the bus).

Not the users' client (that is :class:`~toolfleet.client.Client`, opened with
:func:`~toolfleet.client.connect_kafka` or :func:`~toolfleet.client.connect_http`): the
HTTP API, the CLI and :class:`~toolfleet.client.kafka.KafkaClient` publish through it,
so there is one way to build an invoke CloudEvent (key, extensions, trace context).
Waiting reads the results and events topics directly, only the partition the tenant's
key maps to, positioned before publishing so no outcome can be missed. While nobody
waits, the watcher's partitions are paused (it costs the broker nothing); registering a
wait resumes it where it stopped. The broker profile (``TOOLFLEET_BROKER_PROFILE``,
:mod:`toolfleet.bus.profile`) paces the watcher: ``kafka`` long-polls; under the dev
broker's profile each acknowledged send rings its topic so that resting consumers of the
fleet wake, and the watcher itself rests between outcomes and wakes when the results or
events topic rings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from types import TracebackType
from typing import Any, Self, Unpack

from aiokafka import AIOKafkaConsumer, TopicPartition

from toolfleet.auth.control import ControlSigner, control_claims
from toolfleet.auth.outcomes import OutcomeVerifier
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.profile import BrokerProfile, FetchPacing, PacingInput, open_profile
from toolfleet.client.handles import InvocationHandle, Progress, ProgressCallback
from toolfleet.client.requests import InvokeOptions, RequestPublisher
from toolfleet.errors import InvalidEvent
from toolfleet.events.codec import decode
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import valid_traceparent
from toolfleet.events.models import (
    ApprovalDecision,
    CancelRequested,
    InvokeRequested,
    ToolOutcome,
)
from toolfleet.events.types import TERMINAL_TYPES, EventType, Source, TopicName, topic
from toolfleet.observability.metrics import OUTCOMES_REFUSED
from toolfleet.observability.tracing import current_traceparent
from toolfleet.settings import FleetSettings

log = logging.getLogger(__name__)


class KafkaPublisher(RequestPublisher):
    """The fleet's publisher: ``async with KafkaPublisher(settings) as publisher``.

    It acts for any tenant (each control call names it), so it is for the fleet's own
    processes; a user opens a :class:`~toolfleet.client.Client` instead.
    """

    def __init__(
        self,
        settings: FleetSettings,
        *,
        source: Source | str = Source.CLIENT,
        watch: bool = True,
        profile: BrokerProfile | None = None,
    ) -> None:
        """``profile``: the broker profile (:mod:`toolfleet.bus.profile`); unset, the one
        ``TOOLFLEET_BROKER_PROFILE`` names, which the client closes when it stops."""
        self._settings = settings
        self._source = str(source)
        self._watch = watch
        self._own_profile = profile is None
        self._profile = profile if profile is not None else open_profile(settings)
        self._producer = EventProducer(
            settings, client_id="toolfleet-client", traffic=self._profile.announcer
        )
        self._waiting = asyncio.Event()
        self._watcher: AIOKafkaConsumer | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._listen_tasks: list[asyncio.Task[None]] = []
        self._listening = asyncio.Event()
        self._pacing: FetchPacing | None = None
        self._outcomes: dict[str, asyncio.Future[ToolOutcome]] = {}
        self._progress: dict[str, ProgressCallback] = {}
        self._tenants: dict[str, str] = {}
        """The tenant each awaited invocation belongs to: a call is (tenant, invocation id),
        so another tenant's outcome for the same id (its ``invocation_id_conflict``) is
        never this caller's."""
        self._partitions: list[int] = []
        self._signer = ControlSigner.from_settings(settings)
        # A client that waits trusts only outcomes the fleet signed: without the grant
        # key it could not tell a forged ``succeeded`` from a real one, so it refuses to
        # start (GrantKeyError, saying how to fix it) rather than trust every outcome.
        self._outcomes_verifier = OutcomeVerifier.from_settings(settings) if watch else None

    @property
    def signs_control(self) -> bool:
        """Whether control events are signed (``TOOLFLEET_GRANT_KEY_FILE`` is set).

        Policy refuses unsigned approvals, denials and cancels: only a process trusted
        with the fleet's grant key (the API, an operator's CLI) can decide calls.
        """
        return self._signer is not None

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()  # stopped even when starting failed half-way
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        log.info(self._profile.summary())
        await self._producer.start()
        results = topic(self._settings.topic_prefix, TopicName.RESULTS)
        self._partitions = sorted(await self._producer.partitions_for(results))
        if self._watch:
            await self._start_watcher()

    async def stop(self) -> None:
        self._listening.set()
        for task in self._listen_tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        if self._pacing is not None:
            self._pacing.close()
        if self._watcher is not None:
            await self._watcher.stop()
        await self._producer.stop()
        if self._own_profile:
            await self._profile.aclose()

    # --- publishing -----------------------------------------------------------------

    async def publish(
        self, request: InvokeRequested, *, traceparent: str | None = None
    ) -> InvocationHandle:
        """Publish a prepared request (the HTTP API's path)."""
        event_id = str(uuid.uuid4())
        invocation_id = str(request.invocation_id or event_id)
        tenant = request.agent_context.tenant_id
        trace = traceparent or current_traceparent()
        envelope = new_event(
            event_type=EventType.INVOKE_REQUESTED,
            source=self._source,
            data={
                **request.model_dump(mode="json", exclude_none=False),
                "invocation_id": invocation_id,
            },
            tenant_id=tenant,
            invocation_id=invocation_id,
            event_id=event_id,
            traceparent=trace,
        )
        if self._watcher is not None:
            # Registered before publishing: a fast tool's outcome may beat ``wait``.
            # ``setdefault``: an ``expect`` of this id already registered it.
            self._outcomes.setdefault(invocation_id, asyncio.get_running_loop().create_future())
            self._tenants[invocation_id] = tenant
            self._waiting.set()
        await self._producer.send(
            Outbound(envelope=envelope, topic=self._topic(TopicName.REQUESTED))
        )
        return InvocationHandle(
            invocation_id=invocation_id, tenant_id=tenant, event_id=event_id, traceparent=trace
        )

    async def cancel(
        self,
        invocation_id: str,
        *,
        tenant_id: str,
        requested_by: str = "",
        reason: str = "",
        traceparent: str | None = None,
    ) -> None:
        """Ask for a call to be cancelled; ``traceparent``: the call's trace (else the
        current span's)."""
        data = CancelRequested(
            invocation_id=uuid.UUID(invocation_id),
            tenant_id=tenant_id,
            requested_by=requested_by,
            reason=reason,
        )
        await self._control(EventType.CANCEL_REQUESTED, data, tenant_id, invocation_id, traceparent)

    async def approve(
        self,
        invocation_id: str,
        *,
        tenant_id: str,
        approver: str = "",
        reason: str = "",
        parameters_hash: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        """Approve a call; with ``parameters_hash``, only the exact request that hash names.

        ``traceparent``: the call's trace, so the approval joins it (else the current span's).
        """
        await self._decide(
            EventType.APPROVAL_GRANTED,
            invocation_id,
            tenant_id,
            approver,
            reason,
            parameters_hash,
            traceparent,
        )

    async def deny(
        self,
        invocation_id: str,
        *,
        tenant_id: str,
        approver: str = "",
        reason: str = "",
        traceparent: str | None = None,
    ) -> None:
        """Deny a call waiting for approval (``traceparent`` as for :meth:`approve`)."""
        await self._decide(
            EventType.APPROVAL_DENIED,
            invocation_id,
            tenant_id,
            approver,
            reason,
            traceparent=traceparent,
        )

    async def _decide(
        self,
        decision: EventType,
        invocation_id: str,
        tenant_id: str,
        approver: str,
        reason: str,
        parameters_hash: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        data = ApprovalDecision(
            invocation_id=uuid.UUID(invocation_id),
            tenant_id=tenant_id,
            approver=approver,
            reason=reason,
            parameters_hash=parameters_hash,
        )
        await self._control(decision, data, tenant_id, invocation_id, traceparent)

    async def _control(
        self,
        event_type: EventType,
        data: CancelRequested | ApprovalDecision,
        tenant_id: str,
        invocation_id: str,
        traceparent: str | None,
    ) -> None:
        if self._signer is not None:
            data = data.model_copy(
                update={"signature": self._signer.sign(control_claims(event_type, data))}
            )
        envelope = new_event(
            event_type=event_type,
            source=self._source,
            data=data,
            tenant_id=tenant_id,
            invocation_id=invocation_id,
            traceparent=valid_traceparent(traceparent) or current_traceparent(),
        )
        await self._producer.send(Outbound(envelope=envelope, topic=self._topic(TopicName.CONTROL)))

    async def emit(self, envelope: Envelope, topic: TopicName) -> None:
        """Publish an event built elsewhere (the API's registry notices)."""
        await self._producer.send(Outbound(envelope=envelope, topic=self._topic(topic)))

    # --- waiting --------------------------------------------------------------------

    def expect(
        self,
        invocation_id: str,
        *,
        tenant_id: str,
        on_progress: ProgressCallback | None = None,
    ) -> InvocationHandle:
        """Be ready for the outcome of an invocation (and, with ``on_progress``, for its
        progress events) before it is published.

        Call it *before* publishing (an event that arrives first would be missed), then
        pass the handle to :meth:`wait`.
        """
        if self._watcher is None:
            raise RuntimeError("this client was started with watch=False")
        self._outcomes.setdefault(invocation_id, asyncio.get_running_loop().create_future())
        self._tenants[invocation_id] = tenant_id
        if on_progress is not None:
            self._progress[invocation_id] = on_progress
            if self._pacing is not None:
                self._pacing.set_quiet(frozenset())  # progress events are awaited now
        self._waiting.set()
        return InvocationHandle(
            invocation_id=invocation_id, tenant_id=tenant_id, event_id="", traceparent=""
        )

    async def wait(
        self,
        handle: InvocationHandle,
        *,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> ToolOutcome:
        """Wait for the invocation's terminal outcome (exactly one is delivered)."""
        if self._watcher is None:
            raise RuntimeError("this client was started with watch=False")
        future = self._outcomes.get(handle.invocation_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._outcomes[handle.invocation_id] = future
        self._tenants[handle.invocation_id] = handle.tenant_id
        if on_progress is not None:
            self._progress[handle.invocation_id] = on_progress
            if self._pacing is not None:
                self._pacing.set_quiet(frozenset())  # progress events are awaited now
        self._waiting.set()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            if future.done():
                self._outcomes.pop(handle.invocation_id, None)
                self._tenants.pop(handle.invocation_id, None)
            self._progress.pop(handle.invocation_id, None)

    async def call(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        **kwargs: Unpack[InvokeOptions],
    ) -> ToolOutcome:
        """``invoke`` then ``wait``."""
        handle = await self.invoke(tool_id, parameters, **kwargs)
        return await self.wait(handle, timeout=timeout)

    def _topic(self, name: TopicName) -> str:
        return topic(self._settings.topic_prefix, name)

    async def _start_watcher(self) -> None:
        # Every partition: a caller may wait for invocations of many tenants at once.
        parts = [
            TopicPartition(self._topic(name), p)
            for name in (TopicName.RESULTS, TopicName.EVENTS)
            for p in self._partitions
        ]
        pacing = self._profile.pacing(
            PacingInput(topics=frozenset(tp.topic for tp in parts), poll_timeout_ms=200)
        )
        consumer = AIOKafkaConsumer(
            **connection_kwargs(self._settings),
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=pacing.broker_wait_ms,
            client_id="toolfleet-client-watch",
        )
        await consumer.start()
        consumer.assign(parts)
        await consumer.seek_to_end(*parts)
        for tp in parts:  # resolve the lazy seek now, before anything is published
            await consumer.position(tp)
        self._watcher = consumer
        pacing.after_start(consumer)
        self._pacing = pacing
        self._listen_tasks = [
            asyncio.create_task(job(self._listening), name="toolfleet-client-profile")
            for job in self._profile.background()
        ]
        self._watch_task = asyncio.create_task(
            self._watch_loop(consumer, pacing), name="toolfleet-client-watch"
        )

    async def _watch_loop(self, consumer: AIOKafkaConsumer, pacing: FetchPacing) -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        progress = frozenset({self._topic(TopicName.EVENTS)})
        while True:
            # Progress events hurry a fetch only while someone follows progress; otherwise
            # they come with the next fetch of outcomes (and are skipped unparsed).
            pacing.set_quiet(frozenset() if self._progress else progress)
            if not self._outcomes and not self._progress:
                # Nobody waits: no fetches until someone does. Paused partitions keep
                # their position, so nothing published meanwhile is skipped.
                consumer.pause(*consumer.assignment())
                self._waiting.clear()
                await self._waiting.wait()
                consumer.resume(*consumer.assignment())
                pacing.after_resume()
            elif pacing.wants_rest(busy=False):
                # Caught up: no fetches until the results or events topic rings.
                consumer.pause(*consumer.assignment())
                await pacing.rest(consumer, never)
                consumer.resume(*consumer.assignment())
                pacing.after_resume()
            batch = await consumer.getmany(timeout_ms=pacing.poll_timeout_ms)
            pacing.after_fetch(records=bool(batch))
            for records in batch.values():
                for record in records:
                    self._route(record.key, record.value, list(record.headers))

    def _route(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        invocation, kind = _binary_call(headers)
        if invocation is not None and invocation not in self._progress:
            if invocation not in self._outcomes:
                return  # nobody here waits for it: skip without parsing the value
            if kind is not None and kind not in TERMINAL_TYPES:
                # Only its outcome is awaited: the call's other events on the topics
                # watched (the executor's ``invoked``, a long tool's checkpoints) are
                # skipped unparsed too.
                return
        try:
            envelope = decode(key=key, value=value, headers=headers)
        except InvalidEvent:
            return
        if envelope.invocationid is None:
            return
        self._deliver(envelope)

    def _deliver(self, envelope: Envelope) -> None:
        invocation_id = envelope.invocationid or ""
        if envelope.tenantid != self._tenants.get(invocation_id, envelope.tenantid):
            return  # the same id in another tenant is another call
        if envelope.type in TERMINAL_TYPES:
            if not self._trusts(envelope):
                return  # still waiting: the real outcome may yet come
            outcome = ToolOutcome.model_validate(envelope.data)
            future = self._outcomes.get(invocation_id)
            if future is not None and not future.done():
                future.set_result(outcome)
            return
        callback = self._progress.get(invocation_id)
        if callback is not None:
            progress = envelope.data.get("progress_percent")
            callback(
                Progress(
                    invocation_id=invocation_id,
                    event_type=envelope.type,
                    progress_percent=float(progress) if progress is not None else None,
                    current_phase=str(envelope.data.get("current_phase", "")),
                )
            )

    def _trusts(self, outcome: Envelope) -> bool:
        """Whether ``outcome`` is signed by the fleet; a refusal is counted and logged
        (status, which reads every outcome, has it audited)."""
        verifier = self._outcomes_verifier
        refusal = verifier.refusal(outcome) if verifier is not None else None
        if refusal is None:
            return verifier is not None
        OUTCOMES_REFUSED.labels(reader="client", refusal=refusal.kind).inc()
        log.warning(
            "outcome refused",
            extra={
                "invocation_id": outcome.invocationid,
                "event_id": outcome.id,
                "refusal": refusal.kind.value,
                "reason": refusal.reason,
            },
        )
        return False


def _binary_call(headers: list[tuple[str, bytes]]) -> tuple[str | None, str | None]:
    """A binary-mode record's ``ce_invocationid`` and ``ce_type`` headers (the last of a
    repeated name, as decoding takes it); ``None`` where absent. Only what lets a record
    be skipped unparsed: what is decoded is judged on its decoded attributes."""
    invocation: str | None = None
    kind: str | None = None
    for key, value in headers:
        if key == "ce_invocationid":
            invocation = value.decode("utf-8", "replace")
        elif key == "ce_type":
            kind = value.decode("utf-8", "replace")
    return invocation, kind
