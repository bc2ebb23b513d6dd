"""How a result leaves the executor: inline in ``invoke.executed``, or as a blob.

A result up to ``TOOLFLEET_RESULT_INLINE_BYTES`` travels inline. A larger one is stored
as a *transfer* blob (:mod:`toolfleet.storage.blobs`) that the validator reads back, so
no event outgrows the broker's limit; one over ``TOOLFLEET_MAX_RESULT_BLOB_BYTES`` fails
the call with ``resource_exhausted``. A Postgres that does not answer is waited out for
a while, since the alternative is running the tool again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay
from tenacity import wait_random_exponential as jittered

from toolfleet.errors import ResourceExhausted
from toolfleet.events.models import ResultBlob
from toolfleet.storage.blobs import ResultBlobs
from toolfleet.storage.errors import POSTGRES_UNAVAILABLE

#: A transfer blob only has to outlive the validator's backlog.
TRANSFER_TTL_S = 24 * 3600


@dataclass(frozen=True, kw_only=True)
class ResultTransfer:
    blobs: ResultBlobs | None
    """Where large results go; None fails every result over ``inline_bytes``."""
    inline_bytes: int = 262_144
    max_bytes: int = 64 * 1_048_576
    store_patience_s: float = 30.0
    """How long a Postgres that does not answer is waited out."""

    async def pack(
        self, result: dict[str, Any], encoded: bytes, *, tenant_id: str, invocation_id: str
    ) -> tuple[dict[str, Any], ResultBlob | None]:
        """``(inline result, None)``, or ``({}, blob)`` when the result went to a blob.

        Raises:
            ResourceExhausted: the result is over ``max_bytes``, or needs a blob and
                there is no blob store.
        """
        size = len(encoded)
        if size <= self.inline_bytes:
            return result, None
        if size > self.max_bytes or self.blobs is None:
            limit = self.max_bytes if self.blobs is not None else self.inline_bytes
            raise ResourceExhausted(
                f"the result is {size} bytes, over the limit of {limit} bytes",
                details={"bytes": size, "limit": limit},
            )
        blobs = self.blobs
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(POSTGRES_UNAVAILABLE),
            stop=stop_after_delay(self.store_patience_s),
            wait=jittered(multiplier=0.1, max=2.0),
            reraise=True,
        ):
            with attempt:
                blob_id = await blobs.put(
                    encoded,
                    tenant_id=tenant_id,
                    invocation_id=invocation_id,
                    purpose="transfer",
                    ttl_s=TRANSFER_TTL_S,
                )
        return {}, ResultBlob(blob_id=blob_id, bytes=size)
