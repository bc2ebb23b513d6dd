"""``topics``, ``retention`` and ``replication``: the broker's topics against ``topics.yaml``.

One description of the topics feeds three checks, each saying its own things once:

* ``topics``: every contract topic and every pool topic in use exists, with the
  partitions of ``TOOLFLEET_TOPIC_PARTITIONS`` (a wrong count is a failure: changing it
  moves tenants to other partitions);
* ``retention``: the other configs of ``topics.yaml`` (``retention.ms``,
  ``cleanup.policy``, ``max.message.bytes``) are applied;
* ``replication``: replicas and ``min.insync.replicas`` are those of
  ``TOOLFLEET_TOPIC_REPLICATION`` (a failure otherwise), and reach the production sizes
  ``topics.yaml`` documents (``replication_factor``; a warning under ``dev``).

Drift is :func:`toolfleet.bus.topics.drift_of`, as ``toolfleet init --check`` finds it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from toolfleet.bus.topics import (
    MIN_INSYNC_REPLICAS,
    Drift,
    TopicsFileError,
    TopicSpec,
    TopicState,
    default_topics_file,
    drift_of,
    load_topic_specs,
)
from toolfleet.doctor.kafka import BrokerInspector
from toolfleet.doctor.results import (
    CheckResult,
    CheckStatus,
    Problem,
    Profile,
    production_only,
    result_of,
)
from toolfleet.events.types import DEFAULT_POOL, TopicName, pool_topic
from toolfleet.settings import FleetSettings

TOPICS = "topics"
RETENTION = "retention"
REPLICATION = "replication"

_PARTITIONS = "partitions"
#: Names listed in a line before the rest is counted.
_SHOWN = 3


@dataclass(frozen=True, kw_only=True)
class TopicFacts:
    """What the broker said about the topics the checks look at."""

    states: Mapping[str, TopicState]
    """Existing topics by name."""
    replicas: Mapping[str, int]
    """Replica count of each existing topic."""


def fleet_specs(
    settings: FleetSettings, pools: Collection[str], topics_file: Path | None = None
) -> list[TopicSpec]:
    """The contract's topics, then one per pool in use (configured as ``invoke.authorized``)."""
    specs = load_topic_specs(settings, topics_file)
    prefix = settings.topic_prefix
    base = next(spec for spec in specs if spec.name == pool_topic(prefix, DEFAULT_POOL))
    extra = [replace(base, name=pool_topic(prefix, p)) for p in sorted(set(pools) - {DEFAULT_POOL})]
    return specs + extra


def production_replication(topics_file: Path | None = None) -> int | None:
    """``defaults.replication_factor`` of ``topics.yaml``: the production size it
    documents (``None`` when the file names none; :class:`TopicsFileError` when it cannot
    be read)."""
    source = topics_file or default_topics_file()
    try:
        doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TopicsFileError(f"cannot read topics from {source}: {type(exc).__name__}") from None
    value = (doc.get("defaults") or {}).get("replication_factor") if isinstance(doc, dict) else None
    return int(value) if isinstance(value, int) and value >= 1 else None


def production_specs(
    settings: FleetSettings, pools: Collection[str], topics_file: Path | None = None
) -> list[TopicSpec]:
    """:func:`fleet_specs` as production sizes them: the file's replication factor (when
    above the configured one), ``min.insync.replicas`` capped at it as usual."""
    wanted = production_replication(topics_file) or settings.topic_replication
    sized = settings.model_copy(
        update={"topic_replication": max(wanted, settings.topic_replication)}
    )
    return fleet_specs(sized, pools, topics_file)


async def read_topics(broker: BrokerInspector, specs: Sequence[TopicSpec]) -> TopicFacts:
    """One description of ``specs``' topics (configs, partitions, replicas)."""
    names = [spec.name for spec in specs]
    states = await broker.describe(names)
    replicas = await broker.replication([name for name in names if name in states])
    return TopicFacts(states=states, replicas=replicas)


def _listed(names: Sequence[str], everyone: int) -> str:
    if len(names) == everyone > 1:
        return f"all {everyone} topics"
    shown = ", ".join(names[:_SHOWN])
    return shown if len(names) <= _SHOWN else f"{shown} and {len(names) - _SHOWN} more"


def _grouped(found: Sequence[tuple[str, str]], everyone: int) -> list[str]:
    """``(topic, text)`` pairs as one phrase per set of topics that share their texts:
    ``all 8 topics: replication 1 < 3, min.insync.replicas 1 < 2``."""
    by_text: dict[str, list[str]] = {}
    for name, text in found:
        by_text.setdefault(text, []).append(name)
    by_topics: dict[tuple[str, ...], list[str]] = {}
    for text, names in by_text.items():
        by_topics.setdefault(tuple(names), []).append(text)
    return [f"{_listed(names, everyone)}: {', '.join(texts)}" for names, texts in by_topics.items()]


def _drifts(specs: Sequence[TopicSpec], facts: TopicFacts) -> list[Drift]:
    return [
        drift
        for spec in specs
        if (state := facts.states.get(spec.name)) is not None
        for drift in drift_of(spec, state)
    ]


def check_topics(specs: Sequence[TopicSpec], facts: TopicFacts) -> CheckResult:
    """``topics``: every topic exists with its partition count."""
    problems: list[Problem] = []
    missing = [spec.name for spec in specs if spec.name not in facts.states]
    if missing:
        problems.append((CheckStatus.FAIL, f"missing {_listed(missing, len(specs))}"))
    wrong = [
        (d.topic, f"{d.have} partitions, want {d.want} (TOOLFLEET_TOPIC_PARTITIONS)")
        for d in _drifts(specs, facts)
        if d.key == _PARTITIONS
    ]
    problems += [(CheckStatus.FAIL, text) for text in _grouped(wrong, len(specs))]
    pools = len(specs) - len(TopicName)
    counted = f"{len(specs)} topics" + (f" ({pools} of pools)" if pools > 0 else "")
    partitions = sorted({spec.partitions for spec in specs})
    each = ", ".join(str(n) for n in partitions)
    return result_of(TOPICS, problems, ok=f"{counted} match topics.yaml, {each} partitions each")


def check_retention(specs: Sequence[TopicSpec], facts: TopicFacts) -> CheckResult:
    """``retention``: the configs of ``topics.yaml`` other than sizes are applied."""
    drifted = [
        (d.topic, f"{d.key} is {d.have if d.have is not None else 'unset'}, want {d.want}")
        for d in _drifts(specs, facts)
        if d.key not in {_PARTITIONS, MIN_INSYNC_REPLICAS}
    ]
    problems: list[Problem] = [(CheckStatus.FAIL, text) for text in _grouped(drifted, len(specs))]
    if problems:
        problems.append((CheckStatus.FAIL, "`toolfleet init --apply` aligns them"))
    present = sum(1 for spec in specs if spec.name in facts.states)
    return result_of(
        RETENTION, problems, ok=f"retention and cleanup as topics.yaml on {present} topics"
    )


def check_replication(
    specs: Sequence[TopicSpec],
    production: Sequence[TopicSpec],
    facts: TopicFacts,
    *,
    profile: Profile,
) -> CheckResult:
    """``replication``: sizes as configured (else a failure), and as production needs
    them (else a failure under ``kafka``, a warning under ``dev``)."""
    configured: list[tuple[str, str]] = []
    short: list[tuple[str, str]] = []
    wanted = {spec.name: spec for spec in production}
    for spec in specs:
        state = facts.states.get(spec.name)
        if state is None:
            continue  # ``topics`` says it is missing
        replicas = facts.replicas.get(spec.name, 0)
        insync = state.config.get(MIN_INSYNC_REPLICAS)
        want_insync = spec.config.get(MIN_INSYNC_REPLICAS)
        if replicas < spec.replication:
            configured.append(
                (
                    spec.name,
                    f"replication {replicas}, TOOLFLEET_TOPIC_REPLICATION says {spec.replication}",
                )
            )
        elif replicas < wanted[spec.name].replication:
            short.append((spec.name, f"replication {replicas} < {wanted[spec.name].replication}"))
        if want_insync is not None and insync != want_insync:
            configured.append(
                (spec.name, f"{MIN_INSYNC_REPLICAS} {insync or 'unset'}, want {want_insync}")
            )
        else:
            floor = wanted[spec.name].config.get(MIN_INSYNC_REPLICAS)
            if floor is not None and int(insync or 0) < int(floor):
                short.append((spec.name, f"{MIN_INSYNC_REPLICAS} {insync} < {floor}"))
    problems: list[Problem] = [
        (CheckStatus.FAIL, text) for text in _grouped(configured, len(specs))
    ]
    gaps = _grouped(short, len(specs))
    if gaps:
        gaps[-1] += " (topics.yaml's production sizes: survive a broker loss)"
    problems += [(production_only(profile), text) for text in gaps]
    sizes = sorted(
        {
            (
                facts.replicas.get(spec.name, 0),
                facts.states[spec.name].config.get(MIN_INSYNC_REPLICAS),
            )
            for spec in specs
            if spec.name in facts.states
        },
        key=str,
    )
    shown = (
        ", ".join(f"replication {r}, {MIN_INSYNC_REPLICAS} {i}" for r, i in sizes) or "no topics"
    )
    return result_of(REPLICATION, problems, ok=shown)
