"""Where an ``invoke.authorized`` call waits in an executor's backlog (pure logic).

The request's ``execution_options.priority`` is the rank (``high`` before ``normal``
before ``low``) and its tenant is the fairness key; see :mod:`toolfleet.bus.scheduler`.
"""

from __future__ import annotations

from toolfleet.bus.scheduler import Placement
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import Priority

#: Rank of each priority: lower starts first.
PRIORITY_RANK: dict[str, int] = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
_DEFAULT_RANK = PRIORITY_RANK[Priority.NORMAL]


def placement(envelope: Envelope) -> Placement:
    """Rank and tenant of an authorized call; never raises.

    Reads the raw ``data`` rather than validating the whole event: this runs for every
    record as it is fetched, and a malformed call still has to reach the handler, which
    turns it into a typed outcome.
    """
    options = envelope.data.get("execution_options")
    priority = options.get("priority") if isinstance(options, dict) else None
    rank = PRIORITY_RANK.get(priority, _DEFAULT_RANK) if isinstance(priority, str) else None
    return Placement(rank=_DEFAULT_RANK if rank is None else rank, tenant=envelope.tenantid or "")
