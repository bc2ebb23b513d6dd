-- Tool sources: MCP servers (stdio or Streamable HTTP) and HTTP APIs whose operations
-- become tools. A source belongs to one tenant, or to every tenant ('*'); its name is
-- part of its tools' ids, so it is unique. Each tool a source offers is kept per schema
-- version; the registry holds its manifest.

CREATE TABLE tool_sources (
    name           text NOT NULL,
    tenant_id      text NOT NULL DEFAULT '*',
    kind           text NOT NULL CHECK (kind IN ('mcp_stdio', 'mcp_http', 'http')),
    target         text NOT NULL,          -- command line, MCP URL or HTTP base URL
    connection_id  text,                   -- whose credentials go in headers
    definition     jsonb NOT NULL,         -- the whole SourceDefinition
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name)
);

CREATE TABLE tool_source_tools (
    tool_id        text NOT NULL,
    version        text NOT NULL,
    source_name    text NOT NULL,
    remote_name    text NOT NULL,          -- the tool's name on the MCP server / operationId
    discovered_via text NOT NULL CHECK (discovered_via IN ('add', 'list_changed', 'refresh')),
    tool           jsonb NOT NULL,         -- the whole SourceTool
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tool_id, version),
    FOREIGN KEY (source_name) REFERENCES tool_sources (name) ON DELETE CASCADE
);

CREATE INDEX tool_source_tools_by_source ON tool_source_tools (source_name);

-- The documents a call read (the outcome's documents_accessed), for the status view.
ALTER TABLE tool_invocations
    ADD COLUMN IF NOT EXISTS documents_accessed jsonb NOT NULL DEFAULT '[]';

-- Document version pins of a call, beside its durable checkpoints: a resume after Redis
-- lost the hot pins still reads the versions the call first read.
CREATE TABLE document_pins (
    invocation_id text NOT NULL,
    document_id   text NOT NULL,
    version       text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (invocation_id, document_id)
);
