-- toolfleet schema v1: registry, invocation projection, checkpoints.

CREATE TABLE tool_definitions (
    tool_id          text PRIMARY KEY,
    namespace        text NOT NULL,
    name             text NOT NULL,
    description      text NOT NULL DEFAULT '',
    category         text NOT NULL DEFAULT 'general',
    tags             text[] NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tool_versions (
    tool_id              text NOT NULL REFERENCES tool_definitions (tool_id) ON DELETE CASCADE,
    version              text NOT NULL,
    major                integer NOT NULL,
    minor                integer NOT NULL,
    patch                integer NOT NULL,
    prerelease           text NOT NULL DEFAULT '',
    lifecycle_state      text NOT NULL DEFAULT 'active'
                         CHECK (lifecycle_state IN ('active', 'deprecated', 'removed')),
    deprecation_message  text,
    effect               text NOT NULL
                         CHECK (effect IN ('read_only', 'state_change', 'external_side_effect')),
    input_schema         jsonb NOT NULL,
    output_schema        jsonb NOT NULL,
    redaction_allowlist  text[] NOT NULL,
    timeout_seconds      double precision NOT NULL,
    schema_hash          text NOT NULL,
    manifest             jsonb NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tool_id, version)
);

CREATE TABLE tool_invocations (
    invocation_id      uuid PRIMARY KEY,
    tenant_id          text NOT NULL,
    agent_did          text,
    user_did           text,
    session_id         text,
    tool_id            text NOT NULL,
    requested_version  text,
    tool_version       text,
    status             text NOT NULL
                       CHECK (status IN ('pending', 'pending_approval', 'running', 'success',
                                         'error', 'timeout', 'cancelled', 'permission_denied')),
    status_rank        smallint NOT NULL,
    current_phase      text NOT NULL DEFAULT '',
    progress_percent   double precision NOT NULL DEFAULT 0,
    parameters         jsonb,             -- sanitized: secrets and PII masked
    result             jsonb,             -- after validation and redaction
    error              jsonb,
    warnings           jsonb NOT NULL DEFAULT '[]',
    latest_checkpoint  jsonb,
    execution_metadata jsonb,
    idempotency_key    text,
    priority           text NOT NULL DEFAULT 'normal',
    trace_id           text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    completed_at       timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX tool_invocations_tenant_created ON tool_invocations (tenant_id, created_at DESC, invocation_id DESC);
CREATE INDEX tool_invocations_tenant_status ON tool_invocations (tenant_id, status);
CREATE INDEX tool_invocations_tenant_tool ON tool_invocations (tenant_id, tool_id);

-- Event ids already projected (source + id): redeliveries change nothing.
CREATE TABLE projected_events (
    source        text NOT NULL,
    event_id      text NOT NULL,
    invocation_id uuid,
    projected_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);

CREATE TABLE tool_checkpoints (
    checkpoint_id      text PRIMARY KEY,
    invocation_id      uuid NOT NULL,
    tenant_id          text NOT NULL,
    checkpoint_type    text NOT NULL CHECK (checkpoint_type IN ('micro', 'macro', 'named')),
    name               text,
    parent_checkpoint_id text,
    progress_percent   double precision NOT NULL DEFAULT 0,
    current_phase      text NOT NULL DEFAULT '',
    state              bytea,
    encoding           text NOT NULL DEFAULT 'json',
    size_bytes         integer NOT NULL DEFAULT 0,
    created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX tool_checkpoints_invocation ON tool_checkpoints (invocation_id, created_at DESC);
