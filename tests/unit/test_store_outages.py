"""A store that stops answering is waited out, whatever form the outage takes.

A Postgres restart reaches a worker as a refused connection, a dropped one, a protocol
left mid-operation, or the server's own "shutting down" / "starting up" notices. The
consumer runtime must retry all of them rather than dead-letter the event, and a durable
checkpoint write must report any of them as ``checkpoint_failed`` (which the tiered
store waits out), never let them escape into the tool as a crash of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg.exceptions as pg
import pytest

from toolfleet.bus.consumer.core import is_transient as _is_transient
from toolfleet.errors import CheckpointFailed, InvalidParameters
from toolfleet.executor.checkpoints.cold import PostgresCheckpointStore
from toolfleet.executor.checkpoints.store import Checkpoint

OUTAGES = [
    ConnectionRefusedError(111, "Connection refused"),
    pg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    pg.InterfaceError("connection is closed"),
    pg.InternalClientError("cannot switch to state 12; another operation is in progress"),
    pg.AdminShutdownError("terminating connection due to administrator command"),
    pg.CannotConnectNowError("the database system is starting up"),
    pg.TooManyConnectionsError("sorry, too many clients already"),
]


@pytest.mark.parametrize("outage", OUTAGES, ids=lambda e: type(e).__name__)
def test_postgres_outages_are_retried_not_dead_lettered(outage: Exception) -> None:
    assert _is_transient(outage)


@pytest.mark.parametrize(
    "error",
    [ValueError("bad data"), KeyError("field"), InvalidParameters("nope")],
    ids=lambda e: type(e).__name__,
)
def test_bugs_and_typed_errors_are_not_transient(error: Exception) -> None:
    assert not _is_transient(error)


class _FailingPool:
    """A pool whose every connection attempt meets ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        raise self.error
        yield  # pragma: no cover


@pytest.mark.parametrize("outage", OUTAGES, ids=lambda e: type(e).__name__)
async def test_durable_checkpoint_write_reports_an_outage_as_checkpoint_failed(
    outage: Exception,
) -> None:
    store = PostgresCheckpointStore(_FailingPool(outage))  # type: ignore[arg-type]
    checkpoint = Checkpoint(
        checkpoint_id="c1",
        invocation_id="0b6f2c8e-2d7c-4a8e-9a57-3f1d8e2b9c10",
        tenant_id="acme",
        checkpoint_type="macro",
        state={"step": 3},
        progress_percent=30.0,
        current_phase="step 3/10",
        timestamp=datetime.now(UTC),
    )
    with pytest.raises(CheckpointFailed) as raised:
        await store.save(checkpoint)
    # The type only: a driver's message may quote the query or its data.
    assert raised.value.message == f"checkpoint could not be saved: {type(outage).__name__}"
