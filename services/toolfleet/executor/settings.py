"""Executor's own knobs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from toolfleet.events.types import DEFAULT_POOL, check_pool_name
from toolfleet.settings import FleetSettings


class SecretBackend(StrEnum):
    """Where tool credentials are resolved (:mod:`toolfleet.secrets`)."""

    ENV = "env"
    """``TOOLFLEET_SECRET__{TENANT}__{CONNECTION}__{NAME}`` environment variables."""
    FILE = "file"
    """One file per credential under ``TOOLFLEET_SECRET_DIR``."""
    VAULT = "vault"
    """HashiCorp Vault KV v2."""


class ExecutorSettings(FleetSettings):
    executor_pools: str = DEFAULT_POOL
    """Comma-separated executor pools this executor serves (``toolfleet worker executor
    --pool NAME``, repeatable, sets it): it reads each pool's topic
    (``invoke.authorized`` for ``default``, ``invoke.authorized.<pool>`` otherwise) in the
    pool's consumer group, and announces them in Redis while it is live. A tool's pool is
    its manifest's ``pool``."""

    @field_validator("executor_pools")
    @classmethod
    def _valid_pools(cls, value: str) -> str:
        pools = [p.strip() for p in value.split(",") if p.strip()]
        if not pools:
            raise ValueError("TOOLFLEET_EXECUTOR_POOLS names no pool (default: 'default')")
        for pool in pools:
            check_pool_name(pool)
        return ",".join(dict.fromkeys(pools))

    @property
    def pool_list(self) -> list[str]:
        """The pools served, each once, in the order given."""
        return self.executor_pools.split(",")

    max_in_flight: int = Field(default=64, ge=1)
    """Invocations one executor runs at once."""
    max_in_flight_per_tenant: int | None = Field(default=None, ge=1)
    """Invocations of one tenant one executor runs at once, so a busy tenant cannot take
    a shared worker from the others (its further calls wait, queued by priority); unset:
    a quarter of ``TOOLFLEET_MAX_IN_FLIGHT`` (at least 1). Single-tenant fleets set it to
    ``TOOLFLEET_MAX_IN_FLIGHT``."""

    @property
    def tenant_in_flight(self) -> int:
        if self.max_in_flight_per_tenant is not None:
            return min(self.max_in_flight_per_tenant, self.max_in_flight)
        return max(1, self.max_in_flight // 4)

    checkpoint_ttl_s: int = Field(default=3600, ge=60)
    """TTL of the hot checkpoint ``checkpoint:tool:{<tenant_id>}:<invocation_id>:latest``."""
    checkpoint_delta_min_bytes: int = Field(default=4096, ge=0)
    """A durable checkpoint whose state's JSON is larger than this is stored in Postgres
    as a delta (RFC 6902 JSON Patch) against the invocation's previous durable one."""
    checkpoint_compress_min_bytes: int = Field(default=1024, ge=0)
    """A durable checkpoint whose encoded state (full or delta) is larger than this is
    stored zlib-compressed."""
    cancel_grace_s: float = Field(default=5.0, ge=0)
    """After a cancel, how long a tool may clean up before it is stopped hard."""
    revoke_grace_s: float = Field(default=5.0, ge=0)
    """On a rebalance, how long running calls of the partitions that move away have to
    reach their next checkpoint (where they are handed over) or finish, before they are
    cancelled and redelivered to the partitions' next owner."""
    lease_ttl_s: float | None = Field(default=None, ge=0.5)
    """TTL of an execution lease, renewed every third of it; unset: the Kafka session
    timeout. A worker silent this long (paused, partitioned, dead) loses its invocations
    to the next epoch; the session timeout bounds how soon another worker is handed them."""

    @property
    def lease_ttl(self) -> float:
        return self.lease_ttl_s or self.session_timeout_ms / 1000

    document_source: str | None = None
    """Where ``ctx.documents`` reads: an MCP server exposing ``get_source_of_truth``,
    ``search_documents``, ``find_overlaps`` and ``get_document_metadata``, as an
    ``http(s)://`` URL (Streamable HTTP) or a command line started as a stdio server,
    e.g. ``python -m toolfleet.documents.reference_server docs.json``. Unset: document
    reads fail with ``document_source_unavailable``."""
    document_source_name: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Name of that source; a request whose ``document_context.source`` names another
    one cannot read documents here. Also names its entries in the Redis cache."""
    document_timeout_s: float = Field(default=10.0, gt=0)
    """How long one request to the document source may take."""
    document_cache_ttl_s: int = Field(default=300, ge=1)
    """TTL of the Redis cache of document answers (also dropped on ``document:updates``)."""

    secret_backend: SecretBackend = SecretBackend.ENV
    """Where tool credentials are resolved: ``env``
    (``TOOLFLEET_SECRET__{TENANT}__{CONNECTION}__{NAME}``), ``file`` (``TOOLFLEET_SECRET_DIR``)
    or ``vault`` (KV v2)."""
    secret_dir: Path | None = None
    """Root of the ``file`` backend: one file per credential at
    ``{tenant}/{connection}/{name}``, not readable by other users."""
    vault_addr: str | None = None
    """Vault URL of the ``vault`` backend, e.g. ``https://vault:8200``."""
    vault_token_file: Path | None = None
    """File holding the executor's Vault token; re-read at every resolution."""
    vault_mount: str = "secret"
    """Mount point of the KV v2 engine; credentials live at ``{mount}/{tenant}/{connection}``."""
    vault_timeout_s: int = Field(default=5, ge=1)
    """HTTP timeout of one Vault request, in seconds."""

    isolation_enabled: bool = True
    """Run tools where their ``isolation`` says (worker processes, sandboxes). Off: every
    Python tool runs in the executor's loop and sandbox-only tools are refused."""
    isolation_warm_sandboxes: int = Field(default=2, ge=0)
    """Sandboxes started ahead of calls (those without file or network grants take one)."""
    isolation_warm_processes: int = Field(default=1, ge=0)
    """Worker processes started ahead for ``isolation="process"`` tools."""
    isolation_fork_server: bool = True
    """Fork ``isolation="process"`` workers (still one fresh process per call) from a
    server that has the SDK imported, instead of starting an interpreter for each call."""
    isolation_warm_tools: int = Field(default=8, ge=0)
    """Recently called tools (per code, runtime and file grant) that keep a warm worker
    of their own, their module imported; 0: none."""
    isolation_max_workers: int = Field(default=64, ge=1)
    """Worker processes and sandboxes alive at once, warm ones included."""
    isolation_uid_base: int = Field(default=200_000, ge=1000)
    """When the executor is root, the sandbox in slot ``n`` runs as uid ``base + n``."""
    isolation_max_processes: int = Field(default=64, ge=1)
    """Processes and threads of one sandbox (``RLIMIT_NPROC`` of its uid)."""
    isolation_max_file_mb: int = Field(default=64, ge=1)
    """Largest file an isolated tool may write (``RLIMIT_FSIZE``); also its tmpfs size."""
    isolation_max_open_files: int = Field(default=256, ge=16)
    """Open files of an isolated tool (``RLIMIT_NOFILE``)."""
    isolation_max_output_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """stdout and stderr an isolated tool may write before it is killed."""
    isolation_kill_grace_s: float = Field(default=1.0, ge=0)
    """After a timeout's SIGTERM, how long before the process group is SIGKILLed."""

    @model_validator(mode="after")
    def _check_secret_backend(self) -> ExecutorSettings:
        if self.secret_backend is SecretBackend.FILE and self.secret_dir is None:
            raise ValueError("TOOLFLEET_SECRET_BACKEND=file needs TOOLFLEET_SECRET_DIR")
        if self.secret_backend is SecretBackend.VAULT and not (
            self.vault_addr and self.vault_token_file
        ):
            raise ValueError(
                "TOOLFLEET_SECRET_BACKEND=vault needs TOOLFLEET_VAULT_ADDR and "
                "TOOLFLEET_VAULT_TOKEN_FILE"
            )
        return self
