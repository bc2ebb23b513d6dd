-- Policy as data in Postgres: the current document per tenant ('*' = every tenant not
-- listed), versioned for optimistic writes, and an append-only history of every write.

CREATE TABLE tool_policies (
    tenant_id   text PRIMARY KEY,
    document    jsonb NOT NULL,
    version     bigint NOT NULL CHECK (version >= 1),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text NOT NULL
);

CREATE TABLE tool_policy_history (
    tenant_id   text NOT NULL,
    version     bigint NOT NULL,
    document    jsonb NOT NULL,
    updated_at  timestamptz NOT NULL,
    updated_by  text NOT NULL,
    PRIMARY KEY (tenant_id, version)
);

-- History is evidence: rows are only ever added.
CREATE FUNCTION tool_policy_history_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tool_policy_history is append-only';
END;
$$;

CREATE TRIGGER tool_policy_history_no_change
    BEFORE UPDATE OR DELETE ON tool_policy_history
    FOR EACH ROW EXECUTE FUNCTION tool_policy_history_append_only();
