-- A source's tool listing: requested by the API (each add or replacement of a source,
-- and `toolfleet sources refresh`), done by an executor, read by the API. The API never
-- starts or reaches a source itself. One row per source, deleted with it.
--
-- state: pending (no answer to the current request yet), ready, failed (error holds the
-- typed ErrorInfo; a retryable failure is tried again from next_attempt_at). An executor
-- claims a due row (FOR UPDATE SKIP LOCKED) until claimed_until; an answer counts only
-- for the request it claimed.

CREATE TABLE source_listings (
    source_name     text PRIMARY KEY REFERENCES tool_sources (name) ON DELETE CASCADE,
    tenant_id       text NOT NULL,             -- the source's tenant when requested
    request         bigint NOT NULL DEFAULT 1, -- one more per request
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'ready', 'failed')),
    requested_at    timestamptz NOT NULL DEFAULT now(),
    requested_via   text NOT NULL DEFAULT 'add' CHECK (requested_via IN ('add', 'refresh')),
    attempts        integer NOT NULL DEFAULT 0, -- since the request
    claimed_by      text,                       -- the worker listing it now
    claimed_until   timestamptz,
    next_attempt_at timestamptz,
    listed_at       timestamptz,                -- when the last attempt ended
    listed_by       text,
    tool_count      integer,                    -- tools of the last listing that succeeded
    error           jsonb                       -- why the last attempt failed
);

CREATE INDEX source_listings_due ON source_listings (requested_at) WHERE state <> 'ready';

-- Sources stored before listings were requested: ready when their tools are known,
-- else pending (the executors list them, as they did those sources in the background).
INSERT INTO source_listings (source_name, tenant_id, state, listed_at, listed_by, tool_count)
SELECT s.name, s.tenant_id,
       CASE WHEN count(t.tool_id) > 0 THEN 'ready' ELSE 'pending' END,
       max(t.created_at),
       CASE WHEN count(t.tool_id) > 0 THEN 'migration' END,
       CASE WHEN count(t.tool_id) > 0 THEN count(DISTINCT t.remote_name) END
FROM tool_sources s LEFT JOIN tool_source_tools t ON t.source_name = s.name
GROUP BY s.name, s.tenant_id;
