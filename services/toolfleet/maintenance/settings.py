"""The maintenance worker's own knobs (retention)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field

from toolfleet.settings import FleetSettings
from toolfleet.storage.retention import RetentionPolicy


class MaintenanceSettings(FleetSettings):
    retention_checkpoint_days: float = Field(default=7.0, gt=0)
    """Checkpoints of a finished call are pruned this many days after it finished."""
    retention_invocation_days: float = Field(default=90.0, gt=0)
    """A finished invocation (with its checkpoints and result blobs) is pruned this many
    days after it finished; calls that have not finished are never pruned."""
    retention_batch_size: int = Field(default=500, ge=1, le=10_000)
    """Rows pruned per transaction."""
    retention_interval_s: float = Field(default=3600.0, gt=0)
    """Seconds between two retention passes of `toolfleet worker maintenance`."""
    retention_archive_dir: Path | None = None
    """Directory where pruned rows are archived as JSON lines before they are deleted
    (`{table}/{YYYY-MM-DD}.jsonl`); unset: deleted without an archive."""

    def retention_policy(self) -> RetentionPolicy:
        """The policy these settings describe (dedupe rows go after ``dedupe_ttl_s``)."""
        return RetentionPolicy(
            checkpoints_after=timedelta(days=self.retention_checkpoint_days),
            invocations_after=timedelta(days=self.retention_invocation_days),
            dedupe_after=timedelta(seconds=self.dedupe_ttl_s),
            batch_size=self.retention_batch_size,
        )
