"""The store errors that mean "the server is not answering right now": wait them out.

A restart of Postgres shows up as several exception families depending on when a call
meets it: a refused connection (``OSError``), a dropped one (``PostgresConnectionError``,
``InterfaceError``), a protocol left mid-operation by the drop (``InternalClientError``),
or the server's own notices (``OperatorInterventionError``: shutting down, starting up;
``InsufficientResourcesError``: too many connections). None of them says anything about
the request, so callers retry instead of failing it.
"""

from __future__ import annotations

import asyncpg.exceptions as pg

POSTGRES_UNAVAILABLE: tuple[type[Exception], ...] = (
    OSError,
    pg.PostgresConnectionError,
    pg.InterfaceError,
    pg.InternalClientError,
    pg.OperatorInterventionError,
    pg.InsufficientResourcesError,
)

POSTGRES_FAILURES: tuple[type[Exception], ...] = (*POSTGRES_UNAVAILABLE, pg.PostgresError)
"""Postgres away, or refusing a statement: what a background job (a ``LISTEN``, a
sweep, a durable write) logs and tries again, where a request would fail."""
