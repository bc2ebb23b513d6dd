-- A call is (tenant_id, invocation_id): a document pin belongs to its tenant's call, so
-- another tenant naming the same invocation id neither reads nor fixes its versions.
-- Pins written before this migration have no tenant; they are kept but match no call
-- (a resume of such a call reads the documents again and pins what it gets).
ALTER TABLE document_pins ADD COLUMN tenant_id text NOT NULL DEFAULT '';
ALTER TABLE document_pins ALTER COLUMN tenant_id DROP DEFAULT;
ALTER TABLE document_pins DROP CONSTRAINT document_pins_pkey;
ALTER TABLE document_pins ADD PRIMARY KEY (tenant_id, invocation_id, document_id);
