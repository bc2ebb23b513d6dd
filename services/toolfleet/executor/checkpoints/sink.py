"""Where ``ToolContext.checkpoint()`` lands: the stores first, then the event.

Each checkpoint is ``micro`` (hot only), ``macro`` or ``named`` (durable too), as
:class:`~toolfleet.executor.checkpoints.schedule.CheckpointSchedule` decides. A write
refused for a stale ``fence`` raises :class:`~toolfleet.executor.leasing.fencing.StaleLease`
out of ``ctx.checkpoint()``. The sink sees only the ports it needs: the store, the
emitter, the cancel flags, and two callbacks into the run (stop it; is it handed over).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from redis.exceptions import RedisError

from toolfleet.bus.emitter import Emitter
from toolfleet.errors import CheckpointFailed, RedactionFailed
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.identity import CallKey
from toolfleet.events.models import CheckpointCreated, CheckpointRef, InvokeAuthorized
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.checkpoints.schedule import CheckpointSchedule
from toolfleet.executor.checkpoints.store import Checkpoint, CheckpointStore
from toolfleet.executor.leasing.fencing import Fence
from toolfleet.executor.leasing.guard import Suspended
from toolfleet.secrets.capability import LeakDetector
from toolfleet.storage.cancel_flags import CancelFlags
from toolfleet.tools.context import CheckpointInput

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CheckpointSink:
    """One run's checkpoints: saved, announced, and collected for its outcome."""

    store: CheckpointStore
    emitter: Emitter
    cancels: CancelFlags
    parent: Envelope
    """The ``invoke.authorized`` event the run serves (the events' parent)."""
    call: InvokeAuthorized
    cancel_event: asyncio.Event
    leaks: LeakDetector
    cancel_local: Callable[[], object]
    """Stops the run (a cancel flag this worker's control consumer missed)."""
    suspended: Callable[[], bool]
    """True once the call is being handed over (shutdown, partition revoked)."""
    fence: Fence | None = None
    """The lease epoch every checkpoint write is fenced with (None: unfenced)."""
    refs: list[CheckpointRef] = field(default_factory=list)
    acks: list[Awaitable[object]] = field(default_factory=list)
    schedule: CheckpointSchedule = field(init=False)

    def __post_init__(self) -> None:
        self.schedule = CheckpointSchedule(
            interval_s=self.call.checkpoint_config.checkpoint_interval_seconds
        )

    async def _cancel_flagged(self, invocation_id: str) -> bool:
        call = CallKey(tenant_id=self.call.agent_context.tenant_id, invocation_id=invocation_id)
        try:
            return await self.cancels.is_requested(call)
        except RedisError as exc:  # the control topic still delivers the cancel
            log.warning("cancel flag unreadable: %s", type(exc).__name__)
            return False

    async def save(self, checkpoint: CheckpointInput) -> str:
        invocation_id = str(self.call.invocation_id)
        if self.leaks and self.leaks.leaks([checkpoint.state, checkpoint.current_phase]):
            raise RedactionFailed(
                f"{self.call.tool_id} put a credential in a checkpoint; it was not saved"
            )
        checkpoint_id = uuid.uuid4().hex
        now = datetime.now(UTC)
        kind = self.schedule.kind_of(checkpoint.name)
        try:
            kind = await self.store.save(
                Checkpoint(
                    checkpoint_id=checkpoint_id,
                    invocation_id=invocation_id,
                    tenant_id=self.call.agent_context.tenant_id,
                    checkpoint_type=kind,
                    name=checkpoint.name,
                    state=checkpoint.state,
                    progress_percent=checkpoint.progress_percent,
                    current_phase=checkpoint.current_phase,
                    timestamp=now,
                ),
                fence=self.fence,
            )
        except (ConnectionError, OSError) as exc:
            raise CheckpointFailed(f"checkpoint could not be saved: {type(exc).__name__}") from None
        self.schedule.record(kind)
        ack = await self.emitter.emit(
            TopicName.EVENTS,
            new_event(
                event_type=EventType.CHECKPOINT_CREATED,
                source=Source.EXECUTOR,
                data=CheckpointCreated(
                    invocation_id=self.call.invocation_id,
                    tenant_id=self.call.agent_context.tenant_id,
                    tool_id=self.call.tool_id,
                    checkpoint_id=checkpoint_id,
                    checkpoint_type=kind,
                    progress_percent=checkpoint.progress_percent,
                    current_phase=checkpoint.current_phase,
                    timestamp=now,
                ),
                tenant_id=self.call.agent_context.tenant_id,
                invocation_id=invocation_id,
                event_id=derived_event_id(self.parent, EventType.CHECKPOINT_CREATED, checkpoint_id),
                parent=self.parent,
            ),
        )
        self.acks.append(ack)
        self.refs.append(
            CheckpointRef(checkpoint_id=checkpoint_id, checkpoint_type=kind, timestamp=now)
        )
        # A cancel whose control event this worker missed is still seen here.
        if not self.cancel_event.is_set() and await self._cancel_flagged(invocation_id):
            self.cancel_local()
        if self.suspended():
            await ack
            raise Suspended  # saved: the next owner of the call carries on from here
        return checkpoint_id
