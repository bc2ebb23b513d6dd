"""Retention's pure parts: cutoffs from an injected clock, settings, the archive format."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from toolfleet.maintenance.settings import MaintenanceSettings
from toolfleet.status import store as status_store
from toolfleet.storage.retention import (
    PROJECTION_LOCK_CLASS,
    JsonLinesArchive,
    PruneReport,
    RetentionJob,
    RetentionPolicy,
    json_line,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_cutoffs_follow_the_clock_and_the_defaults() -> None:
    cutoffs = RetentionPolicy().cutoffs(NOW)
    assert cutoffs.checkpoints == NOW - timedelta(days=7)
    assert cutoffs.invocations == NOW - timedelta(days=90)
    assert cutoffs.dedupe == NOW - timedelta(days=7)


def test_settings_describe_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLEET_RETENTION_CHECKPOINT_DAYS", "1.5")
    monkeypatch.setenv("TOOLFLEET_RETENTION_INVOCATION_DAYS", "30")
    monkeypatch.setenv("TOOLFLEET_DEDUPE_TTL_S", "3600")
    monkeypatch.setenv("TOOLFLEET_RETENTION_BATCH_SIZE", "50")
    policy = MaintenanceSettings().retention_policy()
    assert policy == RetentionPolicy(
        checkpoints_after=timedelta(hours=36),
        invocations_after=timedelta(days=30),
        dedupe_after=timedelta(hours=1),
        batch_size=50,
    )


def test_default_settings_keep_the_documented_ages() -> None:
    policy = MaintenanceSettings().retention_policy()
    assert policy.checkpoints_after == timedelta(days=7)
    assert policy.invocations_after == timedelta(days=90)
    assert policy.dedupe_after == timedelta(seconds=MaintenanceSettings().dedupe_ttl_s)


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        RetentionPolicy(batch_size=0)


def test_retention_skips_invocations_under_the_projections_lock() -> None:
    # Pruning tries the very lock the projection holds while it folds an invocation.
    assert PROJECTION_LOCK_CLASS == status_store._LOCK_CLASS


def test_reports_add_up() -> None:
    total = PruneReport(checkpoints=2, batches=1) + PruneReport(invocations=1, dedupe_rows=3)
    assert total == PruneReport(checkpoints=2, invocations=1, dedupe_rows=3, batches=1)


def test_an_archived_row_is_one_json_line() -> None:
    row_id = uuid.uuid4()
    line = json_line(
        {"invocation_id": row_id, "created_at": NOW, "state": b"\x00\xff", "result": {"a": 1}}
    )
    assert "\n" not in line
    assert json.loads(line) == {
        "invocation_id": str(row_id),
        "created_at": "2026-11-25T12:00:00+00:00",
        "state": "AP8=",
        "result": {"a": 1},
    }


async def test_the_archive_appends_per_table_and_day(tmp_path: Path) -> None:
    archive = JsonLinesArchive(directory=tmp_path)
    day = date(2026, 11, 25)
    await archive.write("tool_invocations", [{"n": 1}], day=day)
    await archive.write("tool_invocations", [{"n": 2}, {"n": 3}], day=day)
    await archive.write("tool_invocations", [], day=day)
    path = tmp_path / "tool_invocations" / "2026-11-25.jsonl"
    assert archive.path("tool_invocations", day) == path
    assert [json.loads(x)["n"] for x in path.read_text().splitlines()] == [1, 2, 3]


async def test_the_job_survives_a_failed_pass_and_stops_when_told() -> None:
    passes: list[str] = []
    stop = asyncio.Event()

    class Flaky(RetentionJob):
        async def prune(self) -> PruneReport:
            passes.append("pass")
            if len(passes) == 1:
                raise ConnectionRefusedError("postgres is restarting")
            stop.set()
            return PruneReport(invocations=1, batches=1)

    job = Flaky(pool=None, clock=lambda: NOW)  # type: ignore[arg-type]  # never touched
    await asyncio.wait_for(job.run(stop, interval_s=0.01), timeout=5)
    assert passes == ["pass", "pass"]
