-- Results too large to travel inline in an event.
-- purpose 'transfer': the executor's raw result, read by the validator (expires soon).
-- purpose 'attachment': the validated, redacted result an outcome links to as a blob
-- attachment (served by GET /v1/invocations/{id}/attachments/{blob_id}).

CREATE TABLE result_blobs (
    blob_id uuid PRIMARY KEY,
    invocation_id uuid NOT NULL,
    tenant_id text NOT NULL,
    purpose text NOT NULL CHECK (purpose IN ('transfer', 'attachment')),
    content_type text NOT NULL,
    size_bytes bigint NOT NULL,
    data bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz
);

CREATE INDEX result_blobs_invocation ON result_blobs (invocation_id);
CREATE INDEX result_blobs_expiry ON result_blobs (expires_at) WHERE expires_at IS NOT NULL;
