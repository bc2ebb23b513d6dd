"""Which kind each checkpoint of an execution is: micro, macro or named.

Every checkpoint is written hot (Redis, latest only). Some are also *durable* (Postgres,
kept with their history):

- ``named``: the tool gave it a name (``ctx.checkpoint(..., name="fetched")``);
- ``macro``: the first checkpoint of the execution, or the first one at least
  ``checkpoint_interval_seconds`` after the last durable one (0: every checkpoint);
- ``micro``: any other; it lives only as long as the hot copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

CheckpointType = Literal["micro", "macro", "named"]


def is_durable(kind: CheckpointType) -> bool:
    """True for the kinds that are stored in Postgres too."""
    return kind != "micro"


@dataclass(kw_only=True)
class CheckpointSchedule:
    """The kind decision for one execution; ``record`` after each checkpoint is saved."""

    interval_s: float
    """``checkpoint_config.checkpoint_interval_seconds`` of the call."""
    clock: Callable[[], float] = time.monotonic
    last_durable_at: float | None = field(default=None, init=False)

    def kind_of(self, name: str | None) -> CheckpointType:
        """The kind of a checkpoint saved now, named ``name`` (None: unnamed)."""
        if name is not None:
            return "named"
        if self.last_durable_at is None or self.clock() - self.last_durable_at >= self.interval_s:
            return "macro"
        return "micro"

    def record(self, kind: CheckpointType) -> None:
        """A checkpoint of ``kind`` was saved: a durable one restarts the interval."""
        if is_durable(kind):
            self.last_durable_at = self.clock()
