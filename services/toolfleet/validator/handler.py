"""Kafka adapter of the validator: ``invoke.executed`` in, terminal outcome out."""

from __future__ import annotations

from collections.abc import Sequence

from toolfleet.bus.producer import Outbound
from toolfleet.bus.runtime import EventConsumer, Inbound
from toolfleet.events import routing
from toolfleet.registry.lookup import ToolLookup
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.registry.store import RegistryStore
from toolfleet.storage.at_rest import TRANSFER_BLOB, AtRestCipher
from toolfleet.storage.blobs import PostgresBlobStore
from toolfleet.validator.service import ValidatorService
from toolfleet.worker import Resources


async def build(res: Resources) -> list[EventConsumer]:
    settings = res.settings
    lookup = ToolLookup(RegistryStore(res.pool))
    # Versions stay cached while the registry's change notices reach this process.
    res.background(lambda stop: lookup.listen(settings.database_url, stop))
    service = ValidatorService(
        lookup=lookup,
        schemas=CompiledSchemas(),
        blobs=PostgresBlobStore(
            res.pool, cipher=AtRestCipher.from_settings(settings, purpose=TRANSFER_BLOB)
        ),
        inline_bytes=settings.result_inline_limit,
        attachment_ttl_s=settings.attachment_ttl_s,
    )

    async def handle(event: Inbound) -> Sequence[Outbound]:
        emitted = await service.on_executed(event.envelope)
        return [Outbound(envelope=env, topic=res.topic(name)) for name, env in emitted]

    spec = res.spec(routing.VALIDATOR_CONSUMER, max_in_flight=settings.max_in_flight)
    # Idempotent by construction, so no Redis dedupe markers: the outcome's id derives
    # from the executed event's (events/outcomes.py) and so does an attachment's blob id.
    return [res.consumer(spec, handle, dedupe=False)]
