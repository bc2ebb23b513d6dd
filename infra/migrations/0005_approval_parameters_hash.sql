-- The parameters hash an approval binds to (from ai.agent.tool.approval.requested), so
-- GET /v1/invocations/{id} can show an approver exactly what an approval would allow.
ALTER TABLE tool_invocations ADD COLUMN IF NOT EXISTS parameters_hash text;
