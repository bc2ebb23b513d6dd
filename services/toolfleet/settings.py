"""Fleet-wide configuration, read from ``TOOLFLEET_*`` environment variables (and ``.env``).

Each service extends :class:`FleetSettings` with its own knobs in its ``settings.py``.
The docs' configuration table (``docs/configuration.md``) is checked against these
classes by a test.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Self, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

T = TypeVar("T")


BrokerProfileName = Literal["kafka", "dev"]
"""``TOOLFLEET_BROKER_PROFILE``: ``kafka`` (production) or ``dev`` (the embedded broker)."""


def _by_profile(*, kafka: T, dev: T) -> Callable[[dict[str, Any]], T]:
    """A default that follows ``broker_profile`` (declared before the fields using it)."""

    def default(validated: dict[str, Any]) -> T:
        return dev if validated.get("broker_profile") == "dev" else kafka

    return default


class FleetSettings(BaseSettings):
    """Settings every toolfleet process shares."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLFLEET_",
        env_file=".env",
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
    )

    # --- Kafka -------------------------------------------------------------------------
    kafka_bootstrap: str = "127.0.0.1:9092"
    """Comma-separated ``host:port`` list of Kafka brokers."""
    topic_prefix: str = "toolfleet."
    """Prefix of every topic name (``toolfleet.invoke.requested`` ...)."""
    topic_partitions: int = Field(default=12, ge=1)
    """Partitions per topic when toolfleet creates its topics (`toolfleet dev` on its
    embedded broker: 3 unless set)."""
    topic_replication: int = Field(default=1, ge=1)
    """Replication factor when toolfleet creates its topics; caps the
    ``min.insync.replicas`` of ``topics.yaml``."""
    broker_profile: BrokerProfileName = "kafka"
    """What the fleet's clients expect of the brokers. ``kafka`` (Apache Kafka, MSK,
    Confluent, Redpanda): fetches long-poll at the broker, the producer is idempotent with
    ``acks=all``, a stopping worker leaves its group at once. ``dev``: the embedded broker
    of ``toolfleet dev`` and the tests (``toolfleet.devstack.broker_profile``). Workers
    log the profile they run at start."""
    fetch_max_wait_ms: int = Field(default_factory=_by_profile(kafka=500, dev=5), ge=0)
    """How long the broker may hold a fetch that found no records (ms). A broker that
    long-polls answers the moment a record lands, so this sets how often an idle consumer
    asks, not a hop's latency. Unset: 500 with the ``kafka`` profile, 5 with ``dev``."""
    linger_ms: int = Field(default=0, ge=0)
    """Producer batching delay, added to every hop (0 by default)."""
    enable_idempotence: bool = Field(default_factory=_by_profile(kafka=True, dev=False))
    """Idempotent producer (a retried send is written once, in order). Unset: on with the
    ``kafka`` profile, off with ``dev``; off for a Kafka-compatible service without it."""
    session_timeout_ms: int = Field(default=10_000, ge=1_000)
    """Consumer session timeout: how soon a dead worker's partitions move elsewhere."""
    max_event_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest accepted message value; larger ones go to the DLQ."""
    result_inline_bytes: int = Field(default=262_144, ge=1024)
    """Most result bytes an event carries inline. A larger result travels as a blob in
    Postgres and the outcome carries a truncated preview plus a blob attachment. Bounded
    by half of ``TOOLFLEET_MAX_EVENT_BYTES``."""
    max_result_blob_bytes: int = Field(default=64 * 1_048_576, ge=1024)
    """Largest result a tool may return at all; a larger one is ``resource_exhausted``."""
    attachment_ttl_s: int = Field(default=30 * 24 * 3600, ge=0)
    """How long a result attachment stays downloadable (0 = kept until deleted)."""

    # --- Kafka security: one connection factory applies it (toolfleet.bus.connection) ---
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How every producer, consumer and admin client talks to the brokers: ``PLAINTEXT``,
    ``SSL`` (TLS), ``SASL_PLAINTEXT`` or ``SASL_SSL`` (SASL over TLS, for production)."""
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """SASL mechanism; required with the ``SASL_*`` protocols (``PLAIN`` only over TLS in
    production: it sends the password as is)."""
    kafka_sasl_username: str | None = None
    """SASL user name; required with the ``SASL_*`` protocols."""
    kafka_sasl_password_file: Path | None = None
    """File holding the SASL password (one line), re-read whenever a client is built; the
    password itself is never a setting, so it never shows in the environment or a log."""
    kafka_ssl_ca_file: Path | None = None
    """PEM CA bundle that verifies the brokers' certificates (``SSL``, ``SASL_SSL``);
    unset: the system's trusted CAs."""
    kafka_ssl_cert_file: Path | None = None
    """PEM client certificate for mutual TLS (with ``TOOLFLEET_KAFKA_SSL_KEY_FILE``)."""
    kafka_ssl_key_file: Path | None = None
    """PEM private key of the client certificate (unencrypted; keep it readable only by
    the service's user)."""

    # --- Redis and Postgres -------------------------------------------------------------
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis for checkpoints, dedupe markers, cancellation flags and approvals."""
    database_url: str = "postgresql://postgres@127.0.0.1:5432/toolfleet"
    """Postgres for the registry and the status projection."""

    # --- HTTP API ----------------------------------------------------------------------
    api_url: str = "http://127.0.0.1:8080"
    """Where clients reach the status API (used in ``polling_info.status_url``)."""

    # --- Keys and policy ---------------------------------------------------------------
    home: Path = Path(".toolfleet")
    """State directory of ``toolfleet dev`` (keys, embedded data, ``dev.env``, ``logs/``)."""
    jwt_private_key_file: Path | None = None
    """PEM RSA private key that signs capability tokens (``token issue``)."""
    jwt_public_key_file: Path | None = None
    """PEM RSA public key that verifies capability tokens."""
    jwt_issuer: str = "toolfleet"
    """``iss`` of issued tokens, checked on verification."""
    jwt_audience: str = "toolfleet"
    """``aud`` of issued tokens, checked on verification."""
    policy_file: Path | None = None
    """YAML/JSON policy document; unset means deny everything (production default)."""

    # --- Tools -------------------------------------------------------------------------
    tool_modules: str = ""
    """Comma-separated modules imported for their ``@tool`` definitions, found as
    ``python -m`` finds them (the working directory first)."""
    isolation_memory_mb: int = Field(default=512, ge=16)
    """Address space of an isolated run whose manifest sets none (``RLIMIT_AS``), and the
    most a request's ``resource_limits.memory_mb_limit`` may ask then (policy refuses
    more; limits only go down)."""
    isolation_cpu_millicores: int = Field(default=1000, ge=1)
    """CPU share of an isolated run whose manifest sets none, enforced as CPU time
    (``millicores / 1000 x timeout``, ``RLIMIT_CPU``), and the most a request's
    ``resource_limits.cpu_millicore_limit`` may ask then."""

    # --- Runtime -----------------------------------------------------------------------
    max_in_flight: int = Field(default=256, ge=1)
    """Events a worker processes at once (the executor's concurrency bound); audit and
    status, which see every hop of a call, hold twice as many."""
    drain_timeout_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long in-flight work may finish before it is abandoned."""
    dedupe_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    """How long a processed ``source``+``id`` is remembered."""
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    """A worker's event loop: ``uvloop`` (libuv: cheaper socket and timer handling),
    ``asyncio`` (the standard library's), or ``auto``: uvloop when installed (the
    ``fleet`` extra installs it on Linux and macOS)."""

    # --- Observability -----------------------------------------------------------------
    log_level: str = "INFO"
    """Root log level."""
    log_format: Literal["json", "console"] = "json"
    """Structured JSON logs by default; ``console`` for humans."""
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    """Span exporter: ``none`` (free), ``console`` (stdout) or ``otlp`` (OTLP/HTTP, protobuf)."""
    otel_endpoint: str | None = None
    """Base URL of the OTLP/HTTP collector when the exporter is ``otlp``, e.g.
    ``http://collector:4318``; spans go to its ``/v1/traces``. Unset: the exporter's own
    ``OTEL_EXPORTER_OTLP_*`` default (``http://localhost:4318``)."""
    metrics_port: int = Field(default=0, ge=0)
    """Workers serve Prometheus metrics (``/metrics``), liveness (``/livez``: the event loop
    turns) and readiness (``/readyz``: every consumer in its group) on this port (0 = off;
    ``toolfleet worker analytics`` serves its metrics alone, on loopback; the API has its
    own ``/metrics``)."""
    metrics_host: str = "127.0.0.1"
    """Address the workers' metrics port binds. Loopback by default, since the endpoints
    answer anyone who reaches them; ``0.0.0.0`` (or ``::``) where Prometheus and the
    kubelet reach pods by their IP, as in the Kubernetes manifests."""

    # --- Auth: key rotation, JWKS, revocation, execution grants (toolfleet.auth) --------
    jwks_file: Path | None = None
    """JWKS (RFC 7517) of the keys that verify capability tokens; wins over
    ``TOOLFLEET_JWKS_URL`` and ``TOOLFLEET_JWT_PUBLIC_KEY_FILE``. ``toolfleet keys rotate``
    writes it (unset: ``jwks.json`` beside the private key)."""
    jwks_url: str | None = None
    """HTTP(S) URL of a JWKS that verifies capability tokens (when no JWKS file is set)."""
    jwks_refresh_s: float = Field(default=300.0, ge=1)
    """How often verification keys are reloaded; an unknown ``kid`` reloads them at most
    every 30 s."""
    revocation_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    """How long ``toolfleet token revoke`` remembers a ``jti`` without ``--ttl``; the
    longest a revocation of a token of unknown expiry lasts."""
    revocation_cache_ttl_s: float = Field(default=10.0, ge=0, le=300)
    """How long a process remembers whether a ``jti`` is revoked (0 = ask Redis every
    time). A revocation still takes effect within a second: it is pushed on the Redis
    channel ``token:revocations``, and without that subscription nothing is cached."""
    grant_key_file: Path | None = None
    """File of execution-grant HMAC keys (one per line, the first signs); keys derived
    from it sign control decisions (approve, deny, cancel) and seal raw results at rest.
    Policy, the executor, the validator and the API refuse to start without it: create
    one with ``toolfleet keys grant PATH`` (``toolfleet dev`` makes one)."""
    grant_margin_s: int = Field(default=300, ge=0)
    """An execution grant lives for the tool's timeout plus this margin (queueing, retries)."""

    @field_validator("jwks_url")
    @classmethod
    def _check_jwks_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in {"http", "https"}:
            raise ValueError("TOOLFLEET_JWKS_URL must be an http:// or https:// URL")
        return value

    @field_validator("event_loop")
    @classmethod
    def _check_event_loop(cls, value: str) -> str:
        if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError(
                "TOOLFLEET_EVENT_LOOP=uvloop, but uvloop is not installed "
                "(pip install 'toolfleet[fleet]' installs it on Linux and macOS)"
            )
        return value

    # --- end of auth block ---------------------------------------------------------------

    @model_validator(mode="after")
    def _check_kafka_security(self) -> Self:
        problems = kafka_security_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def result_inline_limit(self) -> int:
        """``result_inline_bytes``, bounded by half of an event (the rest needs room too)."""
        return min(self.result_inline_bytes, self.max_event_bytes // 2)

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        if urlsplit(value).scheme not in {"redis", "rediss", "unix"}:
            raise ValueError("TOOLFLEET_REDIS_URL must be a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        if urlsplit(value).scheme not in {"postgres", "postgresql"}:
            raise ValueError("TOOLFLEET_DATABASE_URL must be a postgresql:// URL")
        return value

    @property
    def tool_module_list(self) -> list[str]:
        return [m.strip() for m in self.tool_modules.split(",") if m.strip()]


_SSL_FILES = ("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file")
_SASL_FIELDS = ("kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password_file")


def kafka_security_problems(settings: FleetSettings) -> list[str]:
    """What is wrong with the Kafka security settings, one sentence per problem.

    A setting that the chosen protocol would ignore is an error rather than a silent
    no-op: an operator who sets a CA file believes the connection is encrypted.
    """
    protocol = settings.kafka_security_protocol
    uses_tls = protocol in {"SSL", "SASL_SSL"}
    uses_sasl = protocol.startswith("SASL_")
    problems: list[str] = []

    def var(name: str) -> str:
        return f"TOOLFLEET_{name.upper()}"

    for name in _SSL_FILES:
        path = getattr(settings, name)
        if path is None:
            continue
        if not uses_tls:
            problems.append(f"{var(name)} is set but TOOLFLEET_KAFKA_SECURITY_PROTOCOL={protocol}")
        elif not path.is_file():
            problems.append(f"{var(name)}: no such file: {path}")
    if (settings.kafka_ssl_cert_file is None) != (settings.kafka_ssl_key_file is None):
        problems.append(
            "TOOLFLEET_KAFKA_SSL_CERT_FILE and TOOLFLEET_KAFKA_SSL_KEY_FILE go together"
        )
    for name in _SASL_FIELDS:
        value = getattr(settings, name)
        if uses_sasl and value is None:
            problems.append(f"{var(name)} is required with {protocol}")
        elif not uses_sasl and value is not None:
            problems.append(f"{var(name)} is set but TOOLFLEET_KAFKA_SECURITY_PROTOCOL={protocol}")
    password_file = settings.kafka_sasl_password_file
    if uses_sasl and password_file is not None and not password_file.is_file():
        problems.append(f"TOOLFLEET_KAFKA_SASL_PASSWORD_FILE: no such file: {password_file}")
    return problems
