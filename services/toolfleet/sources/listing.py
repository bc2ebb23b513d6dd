"""Listing a source's tools: a job executors run, its answer stored for the API to read.

The API never starts or reaches a source. It stores the source and asks for a listing
(``source_listings``, state ``pending``); every executor runs a :class:`ListingJob`,
which claims a pending listing (one executor per listing; the claim is a lease, so a
dead executor's claim passes to another), asks the source through the executor's own
session pool (a stdio server sandboxed when the executor can, each message capped),
checks the answer (:func:`checked`), registers the tools and stores the outcome:
``ready`` with the number of tools, or ``failed`` with a typed error. A retryable
failure (unreachable, ``timeout``) is tried again after :func:`retry_delay_s`; a newer
request for the same source supersedes a claim, whose answer is then dropped.

Every listing is bounded (:class:`~toolfleet.sources.models.ListingLimits`): the
source's ``timeout_s`` (at most 300 s) from start to answer, 1,000 tools, 8 MiB of
definitions, 100 pages, and one message at most the source's ``max_response_bytes``.
A hostile answer (huge, malformed, slow, names that collide) fails its own listing;
the job goes on with the next one.

    ListingJob.run ──claim──▶ ListingQueue (Postgres: store.ListingStore)
         │                         ▲
         └─list──▶ SourceLister ───┘ finish (ready | failed + ErrorInfo)
                  (provider.SourceCatalog: session pool, caps, registry)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from pydantic import ValidationError

from toolfleet.errors import (
    ErrorCode,
    ErrorInfo,
    PermissionDenied,
    ResultTooLarge,
    ResultValidationFailed,
    ToolfleetError,
    ToolTimeout,
)
from toolfleet.sources.models import (
    LISTING_LIMITS,
    Discovery,
    ListingLimits,
    ListingState,
    SourceDefinition,
    SourceListing,
    SourceTool,
    manifest_of,
)

log = logging.getLogger(__name__)

#: How often an idle job looks for a pending listing.
POLL_S = 1.0
#: Listings one executor runs at once (a slow source holds one slot, not the job).
CONCURRENCY = 4
#: A claim outlives the listing's own deadline by this much (registering the tools).
LEASE_MARGIN_S = 30.0
#: First and longest wait before a retryable failure is tried again.
RETRY_FIRST_S, RETRY_MAX_S = 30.0, 600.0
#: Longest tool name quoted in an error (a hostile server chooses them).
_NAME_SHOWN = 64


def retry_delay_s(attempts: int) -> float:
    """The wait before attempt ``attempts + 1`` of a retryable failure: 30 s, doubling
    up to 10 min."""
    doublings = min(max(attempts - 1, 0), 16)  # the cap is reached long before
    return min(RETRY_FIRST_S * 2.0**doublings, RETRY_MAX_S)


def checked(
    source: SourceDefinition, tools: Sequence[SourceTool], limits: ListingLimits = LISTING_LIMITS
) -> list[SourceTool]:
    """``tools`` as listed by ``source``, if the fleet can register every one of them.

    Raises:
        ResultTooLarge: more tools than ``limits.max_tools``.
        ResultValidationFailed: two tools that map to one tool id, or a tool whose
            manifest the registry would refuse (an id over 128 characters, say).
    """
    if len(tools) > limits.max_tools:
        raise ResultTooLarge(
            f"the source {source.name} lists {len(tools)} tools, over {limits.max_tools}",
            details={"source": source.name, "max_tools": limits.max_tools},
        )
    seen: dict[str, str] = {}
    for tool in tools:
        other = seen.setdefault(tool.tool_id, tool.remote_name)
        if other != tool.remote_name:
            raise ResultValidationFailed(
                f"the source {source.name} lists two tools named as {_shown(tool.tool_id)}: "
                f"{_shown(other)!r} and {_shown(tool.remote_name)!r}",
                details={"source": source.name},
            )
        try:
            manifest_of(tool)
        except ValidationError as exc:
            fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
            raise ResultValidationFailed(
                f"the source {source.name} lists a tool the registry refuses "
                f"({_shown(tool.remote_name)!r}: {', '.join(fields)})",
                details={"source": source.name, "fields": fields},
            ) from None
    return list(tools)


def _shown(name: str) -> str:
    return name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "..."


@dataclass(frozen=True, kw_only=True)
class ListingClaim:
    """A listing one worker took: the source as stored when it was claimed."""

    source: SourceDefinition
    tenant_id: str
    """The tenant the listing was requested for (the source's at request time)."""
    request: int
    """Which request this answers (a newer one supersedes it)."""
    via: Discovery
    attempts: int
    """Attempts since the request, this one included."""


@dataclass(frozen=True, kw_only=True)
class ListingResult:
    """How one attempt ended: ``tools`` listed, or ``error`` (tried again in
    ``retry_in_s`` when retryable)."""

    tools: int | None = None
    error: ErrorInfo | None = None
    retry_in_s: float | None = None


class ListingQueue(Protocol):
    """Where listings are requested, claimed and answered (:class:`store.ListingStore`;
    :class:`MemoryListingQueue` in unit tests)."""

    async def claim(self, worker: str, *, lease_margin_s: float) -> ListingClaim | None:
        """The oldest due listing, claimed by ``worker`` for its deadline plus the margin."""
        ...

    async def is_current(self, claim: ListingClaim, worker: str) -> bool:
        """Whether ``worker`` still holds ``claim`` (no newer request, no removal)."""
        ...

    async def finish(self, claim: ListingClaim, worker: str, result: ListingResult) -> bool:
        """Store ``result`` if ``claim`` is still current; whether it was."""
        ...

    async def release(self, claim: ListingClaim, worker: str) -> None:
        """Give ``claim`` back at once (the worker is stopping)."""
        ...


class SourceLister(Protocol):
    """Asks a source for its tools and registers them (:class:`provider.SourceCatalog`)."""

    async def listed(self, source: SourceDefinition) -> list[SourceTool]:
        """The tools ``source`` offers now, within the listing limits (raises typed)."""
        ...

    async def record(self, tools: list[SourceTool], *, via: Discovery) -> object:
        """Store and register ``tools``."""
        ...


@dataclass(kw_only=True)
class ListingJob:
    """Lists sources' tools as the API asks (see the module docstring); one per executor."""

    queue: ListingQueue
    lister: SourceLister
    worker: str
    limits: ListingLimits = LISTING_LIMITS
    poll_s: float = POLL_S
    concurrency: int = CONCURRENCY

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: claim due listings and run up to ``concurrency`` at once."""
        running: set[asyncio.Task[None]] = set()
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if len(running) >= self.concurrency:
                    await asyncio.wait({stopping, *running}, return_when=asyncio.FIRST_COMPLETED)
                    continue
                claim = await self._claim()
                if claim is None:
                    await asyncio.wait({stopping}, timeout=self.poll_s)
                    continue
                task = asyncio.create_task(self._attempt(claim), name="source-listing")
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            stopping.cancel()
            for task in running:
                task.cancel()
            await asyncio.gather(stopping, *running, return_exceptions=True)

    async def _claim(self) -> ListingClaim | None:
        try:
            return await self.queue.claim(self.worker, lease_margin_s=LEASE_MARGIN_S)
        except Exception as exc:  # Postgres away: look again next round
            log.warning("claiming a source listing failed", extra={"error": type(exc).__name__})
            return None

    async def _attempt(self, claim: ListingClaim) -> None:
        try:
            result = await self.list_one(claim)
        except asyncio.CancelledError:
            # Stopping: hand the listing to another executor now, not at the lease's end.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.queue.release(claim, self.worker))
            raise
        try:
            stored = await self.queue.finish(claim, self.worker, result)
        except Exception as exc:  # the claim expires; another executor tries again
            log.warning(
                "storing a source listing failed",
                extra={"source": claim.source.name, "error": type(exc).__name__},
            )
            return
        log.info(
            "source listed" if result.error is None else "source listing failed",
            extra={
                "source": claim.source.name,
                "tools": result.tools,
                "error": result.error.code if result.error else None,
                "stored": stored,
            },
        )

    async def list_one(self, claim: ListingClaim) -> ListingResult:
        """One attempt at ``claim``; every failure becomes a typed result, none escapes."""
        source = claim.source
        try:
            if claim.tenant_id != source.tenant_id:
                # Requested for another tenant than the source now has: its credentials
                # are not that tenant's to use; a fresh request lists it as it is.
                raise PermissionDenied(
                    f"the listing of {source.name} was requested for another tenant"
                )
            tools = await bounded_listing(self.lister, source, self.limits)
            if not await self.queue.is_current(claim, self.worker):
                return ListingResult(error=_superseded(source))
            await self.lister.record(tools, via=claim.via)
            return ListingResult(tools=len(tools))
        except ToolfleetError as exc:
            info = exc.to_error_info()
        except Exception as exc:  # a bug or a dependency's surprise: typed all the same
            # The type only: a dependency's message may quote what the source sent.
            log.warning(
                "listing a source failed unexpectedly",
                extra={"source": source.name, "error": type(exc).__name__},
            )
            info = ErrorInfo(
                code=ErrorCode.INTERNAL_ERROR,
                message=f"listing the source {source.name} failed: {type(exc).__name__}",
                retryable=True,
            )
        retry = retry_delay_s(claim.attempts) if info.retryable else None
        return ListingResult(error=info, retry_in_s=retry)


async def bounded_listing(
    lister: SourceLister, source: SourceDefinition, limits: ListingLimits = LISTING_LIMITS
) -> list[SourceTool]:
    """``lister.listed(source)`` within the source's listing deadline, :func:`checked`.

    Raises:
        ToolTimeout: no answer within ``limits.deadline_s(source)`` (retryable).
        ToolfleetError: what the lister or :func:`checked` raised.
    """
    deadline = limits.deadline_s(source)
    try:
        async with asyncio.timeout(deadline):
            return checked(source, await lister.listed(source), limits)
    except TimeoutError:
        raise ToolTimeout(
            f"the source {source.name} did not list its tools within {deadline:g} s",
            details={"source": source.name, "timeout_s": deadline},
        ) from None


def _superseded(source: SourceDefinition) -> ErrorInfo:
    return ErrorInfo(
        code=ErrorCode.STATE_CONFLICT,
        message=f"a newer listing of {source.name} was requested; this answer is dropped",
    )


@dataclass
class _Row:
    listing: SourceListing
    source: SourceDefinition
    request: int
    via: Discovery
    claimed_by: str | None = None
    claimed_until: datetime | None = None


@dataclass(kw_only=True)
class MemoryListingQueue:
    """:class:`ListingQueue` in memory, with ``request`` as the API makes one (tests)."""

    rows: dict[str, _Row] = field(default_factory=dict)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    def request(self, source: SourceDefinition, *, via: Discovery = "add") -> SourceListing:
        previous = self.rows.get(source.name)
        listing = SourceListing(
            source=source.name,
            tenant_id=source.tenant_id,
            state=ListingState.PENDING,
            requested_at=self.now,
        )
        request = previous.request + 1 if previous else 1
        self.rows[source.name] = _Row(listing=listing, source=source, request=request, via=via)
        return listing

    def get(self, name: str) -> SourceListing | None:
        row = self.rows.get(name)
        return None if row is None else row.listing

    async def claim(self, worker: str, *, lease_margin_s: float) -> ListingClaim | None:
        due = [
            row
            for row in self.rows.values()
            if _due(row.listing, self.now)
            and (row.claimed_until is None or row.claimed_until < self.now)
        ]
        if not due:
            return None
        row = min(due, key=lambda r: r.listing.requested_at)
        row.claimed_by = worker
        row.claimed_until = self.now + timedelta(
            seconds=LISTING_LIMITS.deadline_s(row.source) + lease_margin_s
        )
        attempts = row.listing.attempts + 1
        row.listing = row.listing.model_copy(update={"attempts": attempts})
        return ListingClaim(
            source=row.source,
            tenant_id=row.listing.tenant_id,
            request=row.request,
            via=row.via,
            attempts=attempts,
        )

    async def is_current(self, claim: ListingClaim, worker: str) -> bool:
        row = self.rows.get(claim.source.name)
        return row is not None and row.request == claim.request and row.claimed_by == worker

    async def finish(self, claim: ListingClaim, worker: str, result: ListingResult) -> bool:
        if not await self.is_current(claim, worker):
            return False
        row = self.rows[claim.source.name]
        row.claimed_by = row.claimed_until = None
        row.listing = row.listing.model_copy(
            update=_finished(result, worker, self.now, row.listing.tools)
        )
        return True

    async def release(self, claim: ListingClaim, worker: str) -> None:
        if await self.is_current(claim, worker):
            row = self.rows[claim.source.name]
            row.claimed_by = row.claimed_until = None
            attempts = max(row.listing.attempts - 1, 0)  # an attempt cut short does not count
            row.listing = row.listing.model_copy(update={"attempts": attempts})


def _due(listing: SourceListing, now: datetime) -> bool:
    if listing.state is ListingState.PENDING:
        return True
    return (
        listing.state is ListingState.FAILED
        and listing.next_attempt_at is not None
        and listing.next_attempt_at <= now
    )


def _finished(
    result: ListingResult, worker: str, now: datetime, tools: int | None
) -> dict[str, object]:
    """The fields an attempt's end sets (the in-memory twin; the store says it in SQL);
    a failure keeps the count of the last listing that succeeded."""
    retry = None if result.retry_in_s is None else now + timedelta(seconds=result.retry_in_s)
    return {
        "state": ListingState.READY if result.error is None else ListingState.FAILED,
        "listed_at": now,
        "listed_by": worker,
        "tools": tools if result.tools is None else result.tools,
        "error": result.error,
        "next_attempt_at": retry,
    }
