"""Fleet-wide configuration, read from ``TOOLFLEET_*`` environment variables (and ``.env``).

Each service extends :class:`FleetSettings` with its own knobs in its ``settings.py``.
The README's configuration table is checked against these classes by a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    """Partitions per topic when toolfleet creates its topics."""
    topic_replication: int = Field(default=1, ge=1)
    """Replication factor when toolfleet creates its topics."""
    fetch_max_wait_ms: int = Field(default=5, ge=0)
    """How long a fetch may wait for data: sets per-hop latency (low by default)."""
    observer_fetch_max_wait_ms: int = Field(default=50, ge=0)
    """``fetch_max_wait_ms`` of audit and status, which are off the outcome's critical path:
    a little lag there saves the CPU of polling six topics every few milliseconds."""
    linger_ms: int = Field(default=0, ge=0)
    """Producer batching delay, added to every hop (0 by default)."""
    enable_idempotence: bool = False
    """Idempotent producer; off by default because the dev broker lacks it."""
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
    """State directory of ``toolfleet dev`` (keys, embedded data, ``dev.env``)."""
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
    """Comma-separated modules imported for their ``@tool`` definitions."""

    # --- Runtime -----------------------------------------------------------------------
    max_in_flight: int = Field(default=256, ge=1)
    """Events a worker processes at once (the executor's concurrency bound)."""
    drain_timeout_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long in-flight work may finish before it is abandoned."""
    dedupe_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    """How long a processed ``source``+``id`` is remembered."""

    # --- Observability -----------------------------------------------------------------
    log_level: str = "INFO"
    """Root log level."""
    log_format: Literal["json", "console"] = "json"
    """Structured JSON logs by default; ``console`` for humans."""
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    """Span exporter; off by default."""
    otel_endpoint: str | None = None
    """OTLP endpoint when ``otel_exporter=otlp``."""
    metrics_port: int = Field(default=0, ge=0)
    """Workers serve Prometheus metrics on this port (0 = off; the API has ``/metrics``)."""

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
    grant_key_file: Path | None = None
    """File of execution-grant HMAC keys (one per line, the first signs); unset means
    policy mints no grant and the executor cannot require one."""
    grant_margin_s: int = Field(default=300, ge=0)
    """An execution grant lives for the tool's timeout plus this margin (queueing, retries)."""

    @field_validator("jwks_url")
    @classmethod
    def _check_jwks_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in {"http", "https"}:
            raise ValueError("TOOLFLEET_JWKS_URL must be an http:// or https:// URL")
        return value

    # --- end of auth block ---------------------------------------------------------------

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
