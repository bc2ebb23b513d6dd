-- Every change of a registered version wakes the registry caches of policy and the
-- validator (one LISTEN connection per worker), which drop that tool's versions and read
-- them again at its next call: they keep a tool's versions for minutes while they listen,
-- and no call pays a registry read on its critical path for the cache's sake. Whoever
-- writes the row (the API, an executor registering its tools, a source's listing, an
-- operator's psql) is heard the same way; the notice is sent when the transaction
-- commits, never before the change is visible. The payload is the tool id alone, cut to
-- 1,000 characters so that no write can fail on NOTIFY's 8,000-byte bound (a tool id of
-- the contract has at most 128).
CREATE FUNCTION tool_versions_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('tool_versions_changed', left(OLD.tool_id, 1000));
    ELSE
        PERFORM pg_notify('tool_versions_changed', left(NEW.tool_id, 1000));
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER tool_versions_changed
    AFTER INSERT OR UPDATE OR DELETE ON tool_versions
    FOR EACH ROW EXECUTE FUNCTION tool_versions_notify_change();
