-- A call is (tenant_id, invocation_id) in Postgres too (contract section 9): a request of
-- tenant A that names tenant B's invocation id gets a row of its own (where policy's
-- invocation_id_conflict refusal lands), and nothing of A's ever lands on B's row.
-- Every row written before this migration keeps its tenant: ids were unique then.
ALTER TABLE tool_invocations DROP CONSTRAINT tool_invocations_pkey;
ALTER TABLE tool_invocations ADD PRIMARY KEY (tenant_id, invocation_id);
-- Reads by id alone (an admin's GET, the console feed's changed ids, retention).
CREATE INDEX tool_invocations_invocation ON tool_invocations (invocation_id, created_at);

-- The dedupe markers of status are per tenant, as Envelope.dedupe_key is: another
-- tenant's event that reuses a source and id is not a redelivery of this one. Markers
-- written before take the tenant of their invocation's row ('' when there is none).
ALTER TABLE projected_events ADD COLUMN tenant_id text NOT NULL DEFAULT '';
UPDATE projected_events p SET tenant_id = i.tenant_id
    FROM tool_invocations i WHERE i.invocation_id = p.invocation_id;
ALTER TABLE projected_events ALTER COLUMN tenant_id DROP DEFAULT;
ALTER TABLE projected_events DROP CONSTRAINT projected_events_pkey;
ALTER TABLE projected_events ADD PRIMARY KEY (tenant_id, source, event_id);
DROP INDEX IF EXISTS projected_events_invocation;
CREATE INDEX projected_events_invocation
    ON projected_events (invocation_id, tenant_id) WHERE event_kind IS NOT NULL;

-- Result blobs are found by their call, never by its id alone.
DROP INDEX IF EXISTS result_blobs_invocation;
CREATE INDEX result_blobs_invocation ON result_blobs (invocation_id, tenant_id);

-- tool_checkpoints is keyed by checkpoint_id and every read names the tenant
-- (executor/checkpoints/cold.py): only its index gains the tenant.
DROP INDEX IF EXISTS tool_checkpoints_invocation;
CREATE INDEX tool_checkpoints_invocation
    ON tool_checkpoints (invocation_id, tenant_id, created_at DESC);
