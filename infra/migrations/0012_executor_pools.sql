-- Executor pools (issue 33): a tool version belongs to a pool (its manifest's `pool`,
-- default 'default'); policy publishes its calls on that pool's topic. The column mirrors
-- the manifest's member, and re-registering a version restates it (a deployment setting,
-- not part of the version's contract), so `pools_in_use` and `toolfleet doctor` read it
-- without parsing manifests. Versions registered before this migration are in 'default'.
ALTER TABLE tool_versions ADD COLUMN IF NOT EXISTS pool text NOT NULL DEFAULT 'default';
CREATE INDEX IF NOT EXISTS tool_versions_pool ON tool_versions (pool)
    WHERE lifecycle_state <> 'removed';

-- A call waits as 'queued' while no executor of its pool is live (ranked with
-- pending_approval: waiting, not running).
ALTER TABLE tool_invocations DROP CONSTRAINT IF EXISTS tool_invocations_status_check;
ALTER TABLE tool_invocations ADD CONSTRAINT tool_invocations_status_check
    CHECK (status IN ('pending', 'pending_approval', 'queued', 'running', 'success',
                      'error', 'timeout', 'cancelled', 'permission_denied'));
