"""The dev profile's own knobs: read only when ``TOOLFLEET_BROKER_PROFILE=dev``."""

from __future__ import annotations

from pydantic import Field

from toolfleet.settings import FleetSettings


class DevBrokerSettings(FleetSettings):
    """The doorbell and the wait between fetches of the dev profile
    (:mod:`toolfleet.devstack.broker_profile`); the ``kafka`` profile reads none of them."""

    fetch_broker_wait_ms: int = Field(default=1, ge=1)
    """Dev profile: the part of a fetch's wait the broker holds it (ms, at most
    ``fetch_max_wait_ms``); the consumer waits the rest itself before it fetches again,
    and a doorbell ring cuts that short (the dev broker burns CPU while it holds a
    fetch)."""
    fetch_found_wait_ms: int = Field(default=100, ge=0)
    """Dev profile: how long the broker may hold a fetch known to find records (the last
    fetch reported the partition's end past the fetch's offset).
    The dev broker answers such a fetch as soon as it has read them, but the deeper the
    partition, the longer that takes (about 1 ms per thousand record batches it holds,
    none ever trimmed); held only ``fetch_broker_wait_ms`` it answers empty, every time,
    once that takes longer (100 ms: about 90,000 batches). 0: every fetch is held
    ``fetch_broker_wait_ms``."""
    observer_fetch_max_wait_ms: int = Field(default=50, ge=0)
    """Dev profile: ``fetch_max_wait_ms`` of audit and status, which are off the outcome's
    critical path: while awake they fetch at most this often, and wait this long after a
    ring before fetching; one fetch collects several hops."""
    fetch_doorbell: bool = True
    """Dev profile: fetch on demand. Producers ring a topic (Redis pub/sub) once a send to
    it is acknowledged, and a consumer that has caught up rests (partitions paused, no
    fetch requests) until a topic it reads rings. Off: every consumer fetches every
    ``fetch_max_wait_ms`` and never rests."""
    idle_after_ms: int = Field(default=1000, ge=0)
    """Dev profile, with the doorbell: a consumer that fetched no records for this long
    rests, and a producer rings a topic at most every half of it. 0: rest as soon as a
    fetch returned and ring on every send (less CPU per call, not faster: see
    ``bench/HISTORY.md``, fourth pass)."""
    idle_fetch_interval_ms: int = Field(default=500, ge=10)
    """Dev profile: how often a resting consumer first looks for records nobody rang, and
    how long an awake one on the critical path holds a fetch no ring named records for
    (the most a lost ring, or a producer that does not ring, adds to a busy hop's
    latency)."""
    idle_look_max_ms: int = Field(default=4000, ge=10)
    """Dev profile: a resting consumer whose look found nothing looks again twice as long
    after, up to this (ms): what an idle fleet asks the broker, and the most a producer
    that does not ring waits on a fleet idle that long (a ring or records reset it)."""

    @classmethod
    def of(cls, settings: FleetSettings) -> DevBrokerSettings:
        """``settings`` with the dev profile's knobs (from the environment unless
        ``settings`` carries them): the defaults that follow the profile are the dev
        profile's unless set."""
        if isinstance(settings, cls):
            return settings
        return cls(**{**settings.model_dump(exclude_unset=True), "broker_profile": "dev"})
