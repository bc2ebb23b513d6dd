"""Maintenance worker: no consumers, one background job, the retention pass.

Several maintenance workers may run: batches pick rows with ``SKIP LOCKED``, so two
passes at once share the work instead of colliding.
"""

from __future__ import annotations

from toolfleet.bus.runtime import EventConsumer
from toolfleet.maintenance.settings import MaintenanceSettings
from toolfleet.storage.retention import JsonLinesArchive, RetentionJob
from toolfleet.worker import Resources


async def build(res: Resources) -> list[EventConsumer]:
    settings = MaintenanceSettings(**res.settings.model_dump(exclude_unset=True))
    archive_dir = settings.retention_archive_dir
    job = RetentionJob(
        pool=res.pool,
        policy=settings.retention_policy(),
        archive=JsonLinesArchive(directory=archive_dir) if archive_dir is not None else None,
    )

    res.background(lambda stop: job.run(stop, interval_s=settings.retention_interval_s))
    return []
