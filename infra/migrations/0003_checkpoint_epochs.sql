-- The lease epoch a durable checkpoint was written under (NULL: written unfenced).
-- A fenced write is refused once a row of the invocation carries a newer epoch: a worker
-- that lost its lease never appends checkpoints after the one that took the call over.

ALTER TABLE tool_checkpoints ADD COLUMN lease_epoch bigint;
