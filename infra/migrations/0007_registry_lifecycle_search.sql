-- Registry: the lifecycle operators drive (sunset, dates, successor, who changed it),
-- manifest fields summaries show, and tool embeddings for semantic search.

ALTER TABLE tool_versions DROP CONSTRAINT IF EXISTS tool_versions_lifecycle_state_check;
ALTER TABLE tool_versions ADD CONSTRAINT tool_versions_lifecycle_state_check
    CHECK (lifecycle_state IN ('active', 'deprecated', 'sunset', 'removed'));

ALTER TABLE tool_versions
    ADD COLUMN deprecation_date        timestamptz,
    ADD COLUMN sunset_date             timestamptz,
    ADD COLUMN deprecated_in_favor_of  text,
    ADD COLUMN lifecycle_changed_by    text,
    ADD COLUMN lifecycle_changed_at    timestamptz,
    ADD COLUMN requires_approval       boolean NOT NULL DEFAULT false;

-- One embedding per tool (of its id, description, category and tags), written at
-- registration. real[] always; ranked by pgvector when the extension exists, else in
-- process. The model's name travels with it: a new model re-embeds on next registration.
ALTER TABLE tool_definitions
    ADD COLUMN embedding        real[],
    ADD COLUMN embedding_model  text;

-- pgvector where the server has it (the production image does); a plain server without
-- it keeps the migration working and ranks in process.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS vector;
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'pgvector is not available: tool search ranks in process';
END;
$$;
