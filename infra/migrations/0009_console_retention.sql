-- The operators' view (issue 15): an invocation's timeline, a live feed, retention.

-- Every projected event keeps what it said about its invocation, so the console can draw
-- the timeline (requested -> authorized -> invoked -> checkpoints -> outcome) from the
-- status projection. Rows written before this migration have no kind: the timeline then
-- falls back to the invocation row. These rows are the dedupe markers too, pruned after
-- TOOLFLEET_DEDUPE_TTL_S; older invocations keep the coarse timeline of their row.
ALTER TABLE projected_events
    ADD COLUMN IF NOT EXISTS event_kind text,
    ADD COLUMN IF NOT EXISTS occurred_at timestamptz,
    ADD COLUMN IF NOT EXISTS detail jsonb;

CREATE INDEX IF NOT EXISTS projected_events_invocation
    ON projected_events (invocation_id) WHERE event_kind IS NOT NULL;

-- Retention scans: finished calls by age, dedupe rows by age.
CREATE INDEX IF NOT EXISTS tool_invocations_finished
    ON tool_invocations (completed_at) WHERE status_rank = 3;
CREATE INDEX IF NOT EXISTS projected_events_projected_at ON projected_events (projected_at);

-- The console's live list: every change of a row wakes the API's listener (one
-- connection per API process), which reads the changed rows and pushes them to the
-- browsers as Server-Sent Events. The payload is the id alone; nothing of the row leaves
-- the database through the notification.
CREATE FUNCTION tool_invocations_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tool_invocations_changed', NEW.invocation_id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER tool_invocations_changed
    AFTER INSERT OR UPDATE ON tool_invocations
    FOR EACH ROW EXECUTE FUNCTION tool_invocations_notify_change();
