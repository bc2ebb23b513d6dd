"""What toolfleet's topics should look like, and how far the broker's are from it.

Pure logic, no client: :func:`load_topic_specs` reads ``topics.yaml`` (shipped in this
package; ``infra/topics.yaml`` links to it), :func:`sync_topics` compares it with what a
:class:`TopicAdmin` reports and, depending on the :class:`TopicMode`, creates missing
topics and alters drifted configs. The Kafka adapter and the in-memory twin of the port
live in :mod:`toolfleet.bus.admin`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from toolfleet.events.types import TopicName, topic
from toolfleet.settings import FleetSettings

#: Broker-side setting that must not exceed the replication factor, or every
#: ``acks=all`` write fails (a single-broker dev cluster has one replica).
MIN_INSYNC_REPLICAS = "min.insync.replicas"


class TopicAdminError(Exception):
    """The broker refused or does not support a topic operation; the message says which."""


class TopicsFileError(Exception):
    """``topics.yaml`` is unreadable or does not describe exactly the contract's topics."""


class TopicMode(StrEnum):
    """What :func:`sync_topics` may change."""

    CHECK = "check"
    """Change nothing; report missing topics and drift."""
    CREATE = "create"
    """Create missing topics; report drift on existing ones (``toolfleet init``)."""
    APPLY = "apply"
    """Create missing topics and alter drifted configs to match the file."""


@dataclass(frozen=True, kw_only=True)
class TopicSpec:
    """One topic as toolfleet wants it."""

    name: str
    """Full name, prefix included."""
    partitions: int
    replication: int
    config: Mapping[str, str]
    """Topic-level configs (``retention.ms`` ...), values as Kafka strings."""


@dataclass(frozen=True, kw_only=True)
class TopicState:
    """One existing topic as the broker reports it."""

    name: str
    partitions: int
    config: Mapping[str, str]
    """Every config the broker reported (brokers differ: some report defaults too)."""
    overrides: frozenset[str] = frozenset()
    """Keys set on the topic itself; kept when configs are altered (AlterConfigs
    replaces a topic's whole set of overrides)."""


@dataclass(frozen=True, kw_only=True)
class Drift:
    """One difference between the file and an existing topic."""

    topic: str
    key: str
    """A config key, or ``partitions``."""
    want: str
    have: str | None
    """``None``: the broker reports no value for it."""
    alterable: bool = True
    """``partitions`` is not: adding partitions moves tenants to other partitions, and
    their events would no longer be read in order."""


@dataclass(kw_only=True)
class TopicReport:
    """What :func:`sync_topics` found and did."""

    mode: TopicMode
    created: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Absent topics left uncreated (``check`` mode)."""
    drift: list[Drift] = field(default_factory=list)
    """Differences still there when the call returned."""
    altered: list[Drift] = field(default_factory=list)
    """Differences ``apply`` fixed."""

    @property
    def clean(self) -> bool:
        """Every topic exists and matches the file."""
        return not self.missing and not self.drift

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``toolfleet init --json``)."""

        def rows(items: list[Drift]) -> list[dict[str, Any]]:
            return [
                {
                    "topic": d.topic,
                    "key": d.key,
                    "want": d.want,
                    "have": d.have,
                    "alterable": d.alterable,
                }
                for d in items
            ]

        return {
            "mode": self.mode.value,
            "clean": self.clean,
            "created": self.created,
            "missing": self.missing,
            "drift": rows(self.drift),
            "altered": rows(self.altered),
        }


class TopicAdmin(Protocol):
    """The port :func:`sync_topics` needs from a broker."""

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        """The named topics that exist, with their partitions and configs."""
        ...

    async def create(self, specs: Sequence[TopicSpec]) -> None:
        """Create the topics; one that appeared meanwhile is not an error."""
        ...

    async def alter(self, name: str, config: Mapping[str, str]) -> None:
        """Replace the topic's config overrides with ``config``."""
        ...


class _Defaults(BaseModel):
    model_config = ConfigDict(extra="ignore")
    config: dict[str, str | int | float] = {}


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore")
    config: dict[str, str | int | float] = {}


class _TopicsFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    defaults: _Defaults = _Defaults()
    topics: dict[str, _Entry]


def default_topics_file() -> Path:
    """``topics.yaml`` as installed with the package."""
    return Path(str(resources.files("toolfleet.bus") / "topics.yaml"))


def _kafka_value(value: str | int | float) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def load_topic_specs(settings: FleetSettings, path: Path | None = None) -> list[TopicSpec]:
    """The contract's topics as ``path`` (default: the packaged file) describes them.

    Partitions and replication come from ``TOOLFLEET_TOPIC_PARTITIONS`` and
    ``TOOLFLEET_TOPIC_REPLICATION``; ``min.insync.replicas`` is capped at the latter.
    """
    # Imported here: every worker loads this module for its errors and names, and only
    # the commands that create topics (and an executor's pool topics) read the file.
    import yaml

    source = path or default_topics_file()
    try:
        doc = _TopicsFile.model_validate(yaml.safe_load(source.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise TopicsFileError(f"cannot read topics from {source}: {type(exc).__name__}") from None
    wanted = {name.value for name in TopicName}
    if set(doc.topics) != wanted:
        missing = sorted(wanted - set(doc.topics))
        extra = sorted(set(doc.topics) - wanted)
        raise TopicsFileError(
            f"{source} must list exactly the contract's topics (missing: {missing or 'none'}, "
            f"unknown: {extra or 'none'})"
        )
    specs = []
    for name in TopicName:
        merged = doc.defaults.config | doc.topics[name.value].config
        config = {key: _kafka_value(value) for key, value in merged.items()}
        if MIN_INSYNC_REPLICAS in config:
            config[MIN_INSYNC_REPLICAS] = str(
                min(int(config[MIN_INSYNC_REPLICAS]), settings.topic_replication)
            )
        specs.append(
            TopicSpec(
                name=topic(settings.topic_prefix, name),
                partitions=settings.topic_partitions,
                replication=settings.topic_replication,
                config=config,
            )
        )
    return specs


def drift_of(spec: TopicSpec, state: TopicState) -> list[Drift]:
    """How ``state`` differs from ``spec`` (configs the file does not name are ignored)."""
    found = [
        Drift(topic=spec.name, key=key, want=want, have=state.config.get(key))
        for key, want in sorted(spec.config.items())
        if state.config.get(key) != want
    ]
    if state.partitions != spec.partitions:
        found.append(
            Drift(
                topic=spec.name,
                key="partitions",
                want=str(spec.partitions),
                have=str(state.partitions),
                alterable=False,
            )
        )
    return found


async def sync_topics(
    admin: TopicAdmin, specs: Sequence[TopicSpec], *, mode: TopicMode
) -> TopicReport:
    """Compare the broker's topics with ``specs`` and change what ``mode`` allows."""
    report = TopicReport(mode=mode)
    existing = await admin.describe([spec.name for spec in specs])
    absent = [spec for spec in specs if spec.name not in existing]
    if mode is TopicMode.CHECK:
        report.missing = [spec.name for spec in absent]
    elif absent:
        await admin.create(absent)
        report.created = [spec.name for spec in absent]
    for spec in specs:
        state = existing.get(spec.name)
        if state is None:
            continue
        drift = drift_of(spec, state)
        fixable = [d for d in drift if d.alterable]
        if mode is TopicMode.APPLY and fixable:
            kept = {key: state.config[key] for key in state.overrides if key in state.config}
            await admin.alter(spec.name, kept | dict(spec.config))
            report.altered += fixable
            drift = [d for d in drift if not d.alterable]
        report.drift += drift
    return report
