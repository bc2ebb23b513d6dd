"""The broker: how clients reach it (``kafka-security``), what it speaks (``broker-api``),
and the port through which the topic checks see it.

:class:`BrokerInspector` is the port; :class:`KafkaInspector` implements it with
aiokafka's public clients (``AIOKafkaAdminClient`` for topics, ``AIOKafkaClient.send``
of an ``ApiVersionRequest`` for the API versions), :class:`MemoryBroker` is its twin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import ApiVersionRequest

from toolfleet.bus.admin import KafkaTopicAdmin, MemoryTopicAdmin
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.topics import TopicState
from toolfleet.doctor.results import (
    CheckResult,
    CheckStatus,
    Problem,
    Profile,
    production_only,
    result_of,
)
from toolfleet.settings import FleetSettings

SECURITY = "kafka-security"
API = "broker-api"

#: What every toolfleet fleet asks of its brokers: produce, consume in groups with
#: committed offsets, create and describe topics.
REQUIRED_APIS: dict[int, str] = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    18: "ApiVersions",
    19: "CreateTopics",
    32: "DescribeConfigs",
}
#: The idempotent producer (``acks=all``; on by default with the ``kafka`` profile) starts
#: with InitProducerId.
IDEMPOTENT_APIS: dict[int, str] = {22: "InitProducerId"}
#: ``SASL_*`` protocols authenticate with these.
SASL_APIS: dict[int, str] = {17: "SaslHandshake", 36: "SaslAuthenticate"}
#: Not needed to run; ``toolfleet init --apply`` alters drifted topic configs with it.
ALTER_CONFIGS = (33, "AlterConfigs")

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class BrokerInspector(Protocol):
    """What the broker checks read from a cluster."""

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        """The named topics that exist (as :meth:`TopicAdmin.describe
        <toolfleet.bus.topics.TopicAdmin.describe>`)."""
        ...

    async def replication(self, names: Sequence[str]) -> dict[str, int]:
        """Each existing topic's replica count (its least replicated partition's)."""
        ...

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        """``api_key -> (min, max)`` that every broker of the cluster supports."""
        ...


def bootstrap_hosts(bootstrap: str) -> list[str]:
    """The host part of each ``host:port`` (IPv6 in brackets) of a bootstrap list."""
    hosts = []
    for address in (a.strip() for a in bootstrap.split(",")):
        if address:
            host, sep, _ = address.rpartition(":")
            hosts.append((host if sep else address).strip("[]"))
    return hosts


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address; any other name counts as remote (not resolved:
    a name's address can change, and the check must not depend on DNS)."""
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_security(settings: FleetSettings, *, profile: Profile) -> CheckResult:
    """``kafka-security``: TLS and client authentication (SASL or a client certificate)
    whenever a broker is not on this host's loopback; on loopback, a warning."""
    protocol = settings.kafka_security_protocol
    hosts = bootstrap_hosts(settings.kafka_bootstrap)
    remote = sorted({host for host in hosts if not is_loopback(host)})
    gaps = []
    if protocol not in {"SSL", "SASL_SSL"}:
        gaps.append("no TLS (records and credentials travel in clear)")
    if not protocol.startswith("SASL_") and settings.kafka_ssl_cert_file is None:
        gaps.append("no client authentication (SASL or a client certificate)")
    if not gaps:
        how = (
            f"SASL {settings.kafka_sasl_mechanism}"
            if protocol.startswith("SASL_")
            else "a client certificate"
        )
        return CheckResult(
            name=SECURITY,
            status=CheckStatus.OK,
            detail=f"{protocol}: TLS, authenticated with {how}",
        )
    if remote:
        return CheckResult(
            name=SECURITY,
            status=production_only(profile),
            detail=f"{protocol} to {', '.join(remote)}: {'; '.join(gaps)}",
        )
    return CheckResult(
        name=SECURITY,
        status=CheckStatus.WARN,
        detail=f"{protocol} on loopback only: {'; '.join(gaps)}",
    )


def check_api_versions(
    versions: Mapping[int, tuple[int, int]], *, settings: FleetSettings
) -> CheckResult:
    """``broker-api``: the brokers support every API the fleet's clients use with these
    settings (the idempotent producer: ``TOOLFLEET_ENABLE_IDEMPOTENCE``, on by default with
    the ``kafka`` profile). A broker that lacks only AlterConfigs is a warning."""
    needed = dict(REQUIRED_APIS)
    if settings.enable_idempotence:
        needed |= IDEMPOTENT_APIS
    if settings.kafka_security_protocol.startswith("SASL_"):
        needed |= SASL_APIS
    missing = [name for key, name in sorted(needed.items()) if key not in versions]
    problems: list[Problem] = []
    if missing:
        why = " (the idempotent producer)" if "InitProducerId" in missing else ""
        problems.append((CheckStatus.FAIL, f"the broker lacks {', '.join(missing)}{why}"))
    key, name = ALTER_CONFIGS
    if key not in versions:
        problems.append(
            (CheckStatus.WARN, f"no {name}: `toolfleet init --apply` cannot fix drifted configs")
        )
    return result_of(
        API, problems, ok=f"{len(versions)} APIs, all {len(needed)} the fleet's clients use"
    )


def common_versions(
    per_broker: Sequence[Mapping[int, tuple[int, int]]],
) -> dict[int, tuple[int, int]]:
    """The APIs (and version ranges) every broker supports: what a client can rely on
    whichever broker it lands on."""
    if not per_broker:
        return {}
    keys = set(per_broker[0]).intersection(*per_broker[1:])
    common = {}
    for key in keys:
        low = max(versions[key][0] for versions in per_broker)
        high = min(versions[key][1] for versions in per_broker)
        if low <= high:
            common[key] = (low, high)
    return common


class KafkaInspector:
    """:class:`BrokerInspector` over aiokafka's public clients."""

    def __init__(self, admin: AIOKafkaAdminClient, client: AIOKafkaClient) -> None:
        self._admin = admin
        self._client = client
        self._topics = KafkaTopicAdmin(admin)

    @classmethod
    async def open(
        cls, stack: AsyncExitStack, settings: FleetSettings, *, timeout_s: float
    ) -> KafkaInspector:
        """Both clients started, closed when ``stack`` closes (also when starting them
        failed or was cancelled by the caller's timeout).

        Raises:
            KafkaSecurityError: the security settings cannot build a connection.
        """
        request_timeout_ms = max(1000, int(timeout_s * 1000))
        admin = AIOKafkaAdminClient(
            **connection_kwargs(settings), request_timeout_ms=request_timeout_ms
        )
        stack.push_async_callback(admin.close)
        client = AIOKafkaClient(
            **connection_kwargs(settings), request_timeout_ms=request_timeout_ms
        )
        stack.push_async_callback(client.close)
        await admin.start()
        await client.bootstrap()
        return cls(admin, client)

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        return await self._topics.describe(names)

    async def replication(self, names: Sequence[str]) -> dict[str, int]:
        if not names:
            return {}
        described = await self._admin.describe_topics(list(names))
        return {
            entry["topic"]: min(len(p["replicas"]) for p in entry["partitions"])
            for entry in described
            if entry["error_code"] == 0 and entry["partitions"]
        }

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        per_broker = []
        for broker in self._client.cluster.brokers():
            response = await self._client.send(broker.nodeId, ApiVersionRequest())
            per_broker.append({key: (low, high) for key, low, high in response.api_versions})
        return common_versions(per_broker)


@dataclass(kw_only=True)
class MemoryBroker:
    """Twin of :class:`KafkaInspector`: topics in a :class:`MemoryTopicAdmin`, replica
    counts (default 1) and API versions as given."""

    topics: MemoryTopicAdmin = field(default_factory=MemoryTopicAdmin)
    replicas: dict[str, int] = field(default_factory=dict)
    versions: dict[int, tuple[int, int]] = field(default_factory=dict)

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        return await self.topics.describe(names)

    async def replication(self, names: Sequence[str]) -> dict[str, int]:
        return {name: self.replicas.get(name, 1) for name in names if name in self.topics.topics}

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        return dict(self.versions)
