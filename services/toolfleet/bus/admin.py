"""Topic administration: the Kafka adapter of :class:`~toolfleet.bus.topics.TopicAdmin`,
its in-memory twin, and :func:`ensure_topics` for every process that starts a fleet.

Executor pools' topics (``invoke.authorized.<pool>``) are not in ``topics.yaml`` by name:
each is created with the configuration ``topics.yaml`` gives ``invoke.authorized``
(:func:`pool_topic_specs`), by whoever needs it first (:func:`ensure_pool_topics`): an
executor started with ``--pool`` before it subscribes, policy before it publishes the
first call of a pool on it. Where the cluster's ACLs let neither create topics, create
them with ``toolfleet init --pool NAME`` (or the cluster's own tools) beforehand.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import IncompatibleBrokerVersion, for_code

from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.topics import (
    TopicAdminError,
    TopicMode,
    TopicReport,
    TopicSpec,
    TopicState,
    load_topic_specs,
    sync_topics,
)
from toolfleet.events.types import DEFAULT_POOL, TopicName, pool_topic, topic
from toolfleet.settings import FleetSettings

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
#: DescribeConfigs ``config_source`` of a value set on the topic itself.
_DYNAMIC_TOPIC_CONFIG = 1


def all_topics(settings: FleetSettings) -> list[str]:
    return [topic(settings.topic_prefix, name) for name in TopicName]


class KafkaTopicAdmin:
    """:class:`~toolfleet.bus.topics.TopicAdmin` over a started ``AIOKafkaAdminClient``."""

    def __init__(self, client: AIOKafkaAdminClient) -> None:
        self._client = client

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        listed = set(await self._client.list_topics())
        present = [name for name in names if name in listed]
        if not present:
            return {}
        partitions = {
            entry["topic"]: len(entry["partitions"])
            for entry in await self._client.describe_topics(present)
        }
        responses = await self._client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in present]
        )
        states: dict[str, TopicState] = {}
        for response in responses:
            for resource in response.to_object()["resources"]:
                name = resource["resource_name"]
                _raise_for(resource["error_code"], f"describing the configs of {name}")
                entries = resource["config_entries"]
                states[name] = TopicState(
                    name=name,
                    partitions=partitions.get(name, 0),
                    config={
                        e["config_names"]: e["config_value"]
                        for e in entries
                        if e["config_value"] is not None
                    },
                    overrides=frozenset(
                        e["config_names"]
                        for e in entries
                        if e["config_source"] == _DYNAMIC_TOPIC_CONFIG
                    ),
                )
        return states

    async def create(self, specs: Sequence[TopicSpec]) -> None:
        response = await self._client.create_topics(
            [
                NewTopic(
                    spec.name,
                    spec.partitions,
                    spec.replication,
                    topic_configs=dict(spec.config),
                )
                for spec in specs
            ]
        )
        for entry in response.to_object()["topic_errors"]:
            if entry["error_code"] != _TOPIC_ALREADY_EXISTS:  # created meanwhile: fine
                _raise_for(entry["error_code"], f"creating {entry['topic']}")

    async def alter(self, name: str, config: Mapping[str, str]) -> None:
        try:
            responses = await self._client.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name, configs=dict(config))]
            )
        except IncompatibleBrokerVersion:
            raise TopicAdminError(
                "the broker does not support AlterConfigs (some Kafka-compatible brokers "
                "lack it): change the topic configs with the cluster's own tools "
                "(kafka-configs.sh --alter, Terraform, Strimzi)"
            ) from None
        for response in responses:
            for resource in response.to_object()["resources"]:
                _raise_for(resource["error_code"], f"altering the configs of {name}")


class MemoryTopicAdmin:
    """In-memory twin of :class:`KafkaTopicAdmin`; ``alter_supported=False`` behaves like a
    broker without AlterConfigs."""

    def __init__(self, *, alter_supported: bool = True) -> None:
        self.topics: dict[str, TopicState] = {}
        self._alter_supported = alter_supported

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        return {name: self.topics[name] for name in names if name in self.topics}

    async def create(self, specs: Sequence[TopicSpec]) -> None:
        for spec in specs:
            self.topics.setdefault(
                spec.name,
                TopicState(
                    name=spec.name,
                    partitions=spec.partitions,
                    config=dict(spec.config),
                    overrides=frozenset(spec.config),
                ),
            )

    async def alter(self, name: str, config: Mapping[str, str]) -> None:
        if not self._alter_supported:
            raise TopicAdminError("the broker does not support AlterConfigs")
        state = self.topics[name]
        self.topics[name] = TopicState(
            name=name, partitions=state.partitions, config=dict(config), overrides=frozenset(config)
        )


def _raise_for(error_code: int, doing: str) -> None:
    if error_code:
        error = for_code(error_code)
        raise TopicAdminError(f"the broker refused {doing}: {error.message}")


@asynccontextmanager
async def kafka_topic_admin(settings: FleetSettings) -> AsyncIterator[KafkaTopicAdmin]:
    """A started admin client for the configured brokers, closed on exit."""
    client = AIOKafkaAdminClient(**connection_kwargs(settings))
    await client.start()
    try:
        yield KafkaTopicAdmin(client)
    finally:
        await client.close()


def pool_topic_specs(
    settings: FleetSettings, pools: Iterable[str], topics_file: Path | None = None
) -> list[TopicSpec]:
    """The topics of ``pools`` (the default pool's is a contract topic already), each
    configured as ``topics.yaml`` configures ``invoke.authorized``.

    Raises:
        ValueError: a pool name is not valid.
    """
    authorized = topic(settings.topic_prefix, TopicName.AUTHORIZED)
    base = next(s for s in load_topic_specs(settings, topics_file) if s.name == authorized)
    return [
        replace(base, name=pool_topic(settings.topic_prefix, pool))
        for pool in sorted(set(pools))
        if pool != DEFAULT_POOL
    ]


async def sync_fleet_topics(
    settings: FleetSettings,
    *,
    mode: TopicMode,
    topics_file: Path | None = None,
    pools: Iterable[str] = (),
) -> TopicReport:
    """:func:`~toolfleet.bus.topics.sync_topics` against the configured brokers: the
    contract's topics and the topics of ``pools``."""
    specs = load_topic_specs(settings, topics_file) + pool_topic_specs(settings, pools, topics_file)
    async with kafka_topic_admin(settings) as admin:
        report = await sync_topics(admin, specs, mode=mode)
    if report.created:
        log.info("created topics", extra={"topics": report.created})
    if report.drift:
        log.warning(
            "topic configs differ from topics.yaml",
            extra={"drift": [f"{d.topic} {d.key}={d.have} (want {d.want})" for d in report.drift]},
        )
    return report


async def ensure_topics(settings: FleetSettings) -> list[str]:
    """Create every contract topic that does not exist yet, configured as ``topics.yaml``
    says; return the ones created. Existing topics are left as they are."""
    report = await sync_fleet_topics(settings, mode=TopicMode.CREATE)
    return report.created


async def ensure_pool_topics(settings: FleetSettings, pools: Iterable[str]) -> list[str]:
    """Create the topics of ``pools`` that do not exist yet (the configuration of
    ``invoke.authorized``); return the ones created. Nothing to do for the default pool.

    Raises:
        TopicAdminError: the broker refused (no permission to create topics, say).
    """
    specs = pool_topic_specs(settings, pools)
    if not specs:
        return []
    async with kafka_topic_admin(settings) as admin:
        report = await sync_topics(admin, specs, mode=TopicMode.CREATE)
    if report.created:
        log.info("created executor pool topics", extra={"topics": report.created})
    return report.created
